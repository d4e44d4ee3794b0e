// poptorch_sim::topk: torch.topk's contract, built from bitonic merges across tiles.
//
// [Note: bitonic top-k]
// As PopLibs does it: every tile keeps the k best items of its slice as a sorted run (a
// threshold scan keeps this O(slice)); then, in ceil(log2 tiles) supersteps, pairs of tiles
// exchange runs and keep the k best of the two. With both runs ascending and padded to a power
// of two K, min(a[i], b[K-1-i]) is a bitonic sequence holding the K best items, and a bitonic
// merge network (K/2 compare-exchanges per stage, log2 K stages) sorts it again.
// Items order "best first" (see [Note: sort keys]): the key is complemented when largest=True,
// and the index breaks ties, so among equal values the lowest index wins.
#include <memory>
#include <tuple>

#include "common/tensors.h"
#include "sort/ops.h"
#include "sort/sort.h"
#include "sort/sort_dispatch.h"

namespace poptorch_sim {
namespace sorting {
namespace {

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) {
    p <<= 1;
  }
  return p;
}

// The `k` best items of in[lo, hi), sorted best first, padded with sentinels to `padded`.
template <typename Codec, typename scalar_t>
void select_best(
    const scalar_t* in, int64_t lo, int64_t hi, int64_t k, int64_t padded, uint32_t flip,
    std::vector<typename Codec::Item>& out) {
  using Item = typename Codec::Item;
  uint32_t flags = 0;
  const int64_t first = std::min(hi, lo + k);
  const size_t keep = static_cast<size_t>(std::min(k, hi - lo));
  const size_t capacity = static_cast<size_t>(std::max<int64_t>(2 * k, k + 1024));
  out.clear();
  out.reserve(std::max<size_t>(capacity, static_cast<size_t>(padded)));
  for (int64_t i = lo; i < first; ++i) {
    out.push_back(Codec::make(in[i], i, flip, flags));
  }
  Item threshold = out.empty() ? Codec::sentinel() : *std::max_element(out.begin(), out.end());
  for (int64_t i = first; i < hi; ++i) {
    const Item item = Codec::make(in[i], i, flip, flags);
    if (item < threshold) {
      out.push_back(item);
      if (out.size() == capacity) {
        std::nth_element(out.begin(), out.begin() + (k - 1), out.end());
        out.resize(keep);
        threshold = out[keep - 1];
      }
    }
  }
  if (out.size() > keep) {
    std::nth_element(out.begin(), out.begin() + (keep - 1), out.end());
    out.resize(keep);
  }
  std::sort(out.begin(), out.end());
  out.resize(static_cast<size_t>(padded), Codec::sentinel());
}

// a <- the `padded` best of a and b (both sorted best first), sorted again. See the Note.
template <typename Item>
void bitonic_keep_best(Item* a, const Item* b, int64_t padded) {
  for (int64_t i = 0; i < padded; ++i) {
    const Item other = b[padded - 1 - i];
    a[i] = other < a[i] ? other : a[i];
  }
  for (int64_t stride = padded / 2; stride >= 1; stride /= 2) {
    for (int64_t i = 0; i < padded; ++i) {
      if ((i & stride) == 0 && a[i + stride] < a[i]) {
        std::swap(a[i], a[i + stride]);
      }
    }
  }
}

template <typename Codec, typename scalar_t>
void topk_row(
    const scalar_t* in, int64_t n, int64_t k, uint32_t flip, int64_t tiles, KernelScope& scope,
    scalar_t* values, int64_t* indices) {
  using Item = typename Codec::Item;
  const int64_t padded = next_pow2(std::max<int64_t>(k, 1));
  std::vector<std::vector<Item>> runs(static_cast<size_t>(tiles));
  scope.superstep(tiles, [&](int64_t tile) {
    select_best<Codec>(in, split_point(n, tiles, tile), split_point(n, tiles, tile + 1), k,
                       padded, flip, runs[tile]);
  }, n);
  scope.add_compare_exchanges(n);
  const int64_t log_padded = std::max<int64_t>(1, static_cast<int64_t>(std::log2(padded)));
  for (int64_t stride = 1; stride < tiles; stride *= 2) {
    const int64_t pairs = (tiles + 2 * stride - 1) / (2 * stride);
    scope.superstep(pairs, [&](int64_t pair) {
      const int64_t left = pair * 2 * stride;
      if (left + stride < tiles) {
        bitonic_keep_best(runs[left].data(), runs[left + stride].data(), padded);
      }
    }, pairs * padded * log_padded);
    const int64_t merges = tiles / (2 * stride) + ((tiles % (2 * stride)) > stride ? 1 : 0);
    scope.add_compare_exchanges(merges * (padded + padded / 2 * log_padded));
    scope.add_bytes_exchanged(merges * padded * static_cast<int64_t>(sizeof(Item)));
  }
  for (int64_t i = 0; i < k; ++i) {
    const int64_t index = Codec::index(runs[0][i]);
    indices[i] = index;
    values[i] = in[index];
  }
}

template <typename Codec, typename scalar_t>
void topk_last_dim(
    const at::Tensor& input, int64_t k, bool largest, at::Tensor& values, at::Tensor& indices,
    KernelScope& scope) {
  const int64_t n = input.size(-1);
  const int64_t rows = n == 0 ? 0 : input.numel() / n;
  if (rows == 0 || k == 0) {
    return;
  }
  const uint32_t flip = largest ? 0xffffffffu : 0u;
  const scalar_t* in = input.const_data_ptr<scalar_t>();
  scalar_t* out = values.mutable_data_ptr<scalar_t>();
  int64_t* idx = indices.mutable_data_ptr<int64_t>();
  const int64_t per_tile = std::max<int64_t>(2 * k, 4096);
  if (rows == 1) {
    const int64_t tiles = std::max<int64_t>(1, std::min(engine::num_tiles(), n / per_tile));
    topk_row<Codec>(in, n, k, flip, tiles, scope, out, idx);
    return;
  }
  const int64_t tiles = std::min(engine::num_tiles(), rows);
  scope.superstep(tiles, [&](int64_t tile) {
    for (int64_t row = split_point(rows, tiles, tile); row < split_point(rows, tiles, tile + 1);
         ++row) {
      topk_row<Codec>(in + row * n, n, k, flip, 1, scope, out + row * k, idx + row * k);
    }
  }, rows * n);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> topk_cpu(
    const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted) {
  (void)sorted;  // Results always come out sorted, which sorted=False permits.
  check_sortable(self, "topk");
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const at::Tensor moved =
      self.dim() == 0 ? self.reshape({1}) : self.movedim(dim, -1).contiguous();
  const int64_t n = moved.size(-1);
  TORCH_CHECK(
      k >= 0 && k <= n, "poptorch_sim::topk: selected index k out of range: k=", k,
      " but dimension ", dim, " has size ", n, " (k must be in [0, ", n, "])");
  std::vector<int64_t> out_sizes(moved.sizes().begin(), moved.sizes().end());
  out_sizes.back() = k;
  at::Tensor values = empty_tensor(out_sizes, moved.options());
  at::Tensor indices = empty_tensor(out_sizes, moved.options().dtype(at::kLong));
  KernelScope scope("topk");
  dispatch_sort_type(self.scalar_type(), "topk", [&](auto scalar_tag, auto codec_tag) {
    using scalar_t = decltype(scalar_tag);
    using Codec = decltype(codec_tag);
    topk_last_dim<Codec, scalar_t>(moved, k, largest, values, indices, scope);
  });
  if (self.dim() == 0) {
    return {values.reshape({}), indices.reshape({})};
  }
  return {values.movedim(-1, dim).contiguous(), indices.movedim(-1, dim).contiguous()};
}

}  // namespace sorting
}  // namespace poptorch_sim
