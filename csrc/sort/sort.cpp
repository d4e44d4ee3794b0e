// poptorch_sim::sort and ::argsort: torch.sort's contract, sorted over the tile engine.
// See [Note: sort keys] in sort.h, [Note: scatter sort] in scatter_sort.h, [Note: tile engine]
// in engine/tile_engine.h.
#include <cstdlib>
#include <memory>
#include <tuple>

#include "common/tensors.h"
#include "engine/output_cache.h"
#include "sort/bitonic.h"
#include "sort/ops.h"
#include "sort/scatter_sort.h"
#include "sort/sort_dispatch.h"

namespace poptorch_sim {
namespace sorting {

namespace {

// Per-thread scratch memory that outlives a call, so large sorts do not page-fault fresh
// buffers every time. Slot 0 and 1 are the item buffer and its ping-pong partner. Large buffers
// are huge-page blocks (see [Note: output cache]): the scatter writes to hundreds of places at
// once, which with 4 KiB pages would miss the TLB on nearly every item.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { std::free(data_); }

  void* reserve(size_t bytes) {
    if (bytes > capacity_) {
      void* fresh = alloc_block(bytes);
      std::free(data_);
      data_ = fresh;
      capacity_ = block_size(bytes);
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

template <typename Item>
Item* workspace(int slot, int64_t n) {
  thread_local Workspace slots[2];
  return static_cast<Item*>(slots[slot].reserve(static_cast<size_t>(n) * sizeof(Item)));
}

// Rows longer than the bitonic network's, one at a time over all tiles: the scatter sort, else
// per-tile sorts and merges.
template <typename Codec, typename scalar_t>
void sort_rows_tiled(
    const scalar_t* in, int64_t rows, int64_t n, uint32_t flip, scalar_t* values,
    int64_t* indices, KernelScope& scope) {
  using Item = typename Codec::Item;
  constexpr bool kPacked = std::is_same<Item, uint64_t>::value;
  simd::Level level = simd::Level::kBase;  // 64-bit keys: scalar code, no SIMD variants
  if constexpr (kPacked) {
    level = simd::run_level(long_sort_family<scalar_t>());
  }
  const int64_t tiles = engine::num_tiles();
  Item* buf = workspace<Item>(0, n);
  Item* scratch = workspace<Item>(1, n);
  for (int64_t row = 0; row < rows; ++row) {
    uint32_t flags = 0;
    const scalar_t* row_in = in + row * n;
    scalar_t* row_values = values ? values + row * n : nullptr;
    if constexpr (kPacked) {
      if (std::min(tiles, (n + 15) / 16) > 1 && n >= kScatterSortMin &&
          scatter_sort_into<Codec>(row_in, n, flip, tiles, scope, buf, row_values,
                                   indices + row * n, level)) {
        continue;
      }
    }
    Item* sorted =
        tile_sort_row<Codec>(row_in, n, flip, tiles, scope, buf, scratch, flags, level);
    // Four work units per tile, claimed one by one (see [Note: tile pool]).
    write_sorted<Codec>(sorted, n, row_in, flip, flags != 0, row_values, indices + row * n,
                        tiles * 4, &scope);
  }
}

// Longest row sorted whole by the bitonic network (see [Note: bitonic network]), one tile per
// row, even for a single row. Measured (2026-11-23, 2-vCPU EPYC) against the scatter sort and
// per-tile sorts of whole rows (float32, medians of 9): faster up to 2^15 items (1 x 32768: 0.38
// against 0.53 ms; 8 x 32768: 1.65 against 3.79 ms; 64 x 16384: 4.7 against 5.5 ms), either way at
// 2^16, slower from 2^17 (1 x 131072: 1.81 against 1.03 ms).
constexpr int64_t kBitonicRowMax = int64_t{1} << 15;
static_assert(kBitonicRowMax <= (int64_t{1} << bitonic::kIndexBits),
              "the network's items hold indices of kIndexBits bits");

// A bitonic::sort_rows variant.
template <typename scalar_t>
using RowSort = void (*)(const scalar_t*, int64_t, int64_t, int64_t, uint32_t, scalar_t*,
                         int64_t*, int64_t*);

// Short rows of packed items: each tile sorts whole rows with the bitonic network, by the current
// SIMD level's variant unless given another.
template <typename Codec, typename scalar_t>
void sort_rows_bitonic(
    const scalar_t* in, int64_t rows, int64_t n, uint32_t flip, scalar_t* values,
    int64_t* indices, KernelScope& scope, RowSort<scalar_t> sort_rows = nullptr) {
  const int64_t tiles = std::min(engine::num_tiles(), rows);
  if (sort_rows == nullptr) {
    const simd::Level level = simd::run_level(row_sort_family<scalar_t>(n));
    if constexpr (bitonic::kWideKeys<scalar_t>) {  // see [Note: wide keys]
      sort_rows = simd::pick(level, &bitonic::sort_wide_rows_avx512<Codec, scalar_t>,
                             &bitonic::sort_wide_rows_avx2<Codec, scalar_t>,
                             &bitonic::sort_wide_rows_base<Codec, scalar_t>);
    } else {
      sort_rows = simd::pick(level, &bitonic::sort_rows_avx512<Codec, scalar_t>,
                             &bitonic::sort_rows_avx2<Codec, scalar_t>,
                             &bitonic::sort_rows_base<Codec, scalar_t>);
    }
  }
  const int64_t size = bitonic::rows_buffer_size(n);
  scope.superstep(tiles, [&](int64_t tile) {
    std::unique_ptr<int64_t[]> buf(new int64_t[size]);
    sort_rows(in, split_point(rows, tiles, tile), split_point(rows, tiles, tile + 1), n, flip,
              values, indices, buf.get());
  }, rows * n);
  const auto log_size = static_cast<int64_t>(
      std::log2(static_cast<double>(bitonic::padded_size(n, 1))));
  scope.add_compare_exchanges(rows * bitonic::padded_size(n, 1) / 2 * log_size * (log_size + 1) /
                              2);
}

}  // namespace

const char* supported_dtypes_message() {
  return "float32, float64, float16, bfloat16, int64, int32, int16, int8 or uint8";
}

bool is_supported_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kLong:
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
      return true;
    default:
      return false;
  }
}

void sort_last_dim(
    const at::Tensor& input, bool descending, at::Tensor values, at::Tensor indices,
    KernelScope& scope) {
  const int64_t n = input.dim() == 0 ? 1 : input.size(-1);
  if (input.numel() == 0) {
    return;
  }
  TORCH_CHECK(
      n < (int64_t{1} << 32), "poptorch_sim sort: rows longer than 2^32 - 1 elements are not ",
      "supported, got a row of ", n);
  const int64_t rows = input.numel() / n;
  const uint32_t flip = descending ? 0xffffffffu : 0u;
  dispatch_sort_type(input.scalar_type(), "sort", [&](auto scalar_tag, auto codec_tag) {
    using scalar_t = decltype(scalar_tag);
    using Codec = decltype(codec_tag);
    const scalar_t* in = input.const_data_ptr<scalar_t>();
    scalar_t* out = values.defined() ? values.mutable_data_ptr<scalar_t>() : nullptr;
    int64_t* idx = indices.mutable_data_ptr<int64_t>();
    if constexpr (std::is_same<typename Codec::Item, uint64_t>::value ||
                  bitonic::kWideKeys<scalar_t>) {
      if (n <= kBitonicRowMax) {
        sort_rows_bitonic<Codec>(in, rows, n, flip, out, idx, scope);
        return;
      }
    }
    sort_rows_tiled<Codec>(in, rows, n, flip, out, idx, scope);
  });
}

void check_sortable(const at::Tensor& self, const char* op) {
  TORCH_CHECK(
      self.device().is_cpu(), "poptorch_sim::", op, ": expected a CPU tensor, got one on ",
      self.device(), "; move it with .cpu() first");
  TORCH_CHECK(
      is_supported_dtype(self.scalar_type()), "poptorch_sim::", op, ": unsupported dtype ",
      self.scalar_type(), "; supported: ", supported_dtypes_message());
}

std::tuple<at::Tensor, at::Tensor> sort_cpu(const at::Tensor& self, int64_t dim, bool descending) {
  check_sortable(self, "sort");
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const at::Tensor moved = self.movedim(dim, -1).contiguous();
  at::Tensor values = empty_output(moved.sizes(), moved.scalar_type());
  at::Tensor indices = empty_output(moved.sizes(), at::kLong);
  KernelScope scope("sort");
  sort_last_dim(moved, descending, values, indices, scope);
  return {values.movedim(-1, dim).contiguous(), indices.movedim(-1, dim).contiguous()};
}

at::Tensor argsort_cpu(const at::Tensor& self, int64_t dim, bool descending) {
  check_sortable(self, "argsort");
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const at::Tensor moved = self.movedim(dim, -1).contiguous();
  at::Tensor indices = empty_output(moved.sizes(), at::kLong);
  KernelScope scope("argsort");
  sort_last_dim(moved, descending, at::Tensor(), indices, scope);
  return indices.movedim(-1, dim).contiguous();
}

// Whether the 8-lane test hook below was compiled: setup.py leaves it out where the CPU that
// builds the library has AVX-512 (see [Note: the 8-lane hook] in setup.py), whose variant the
// tests run there itself.
bool sort_rows_8_lanes_built() {
#ifdef POPTORCH_SIM_NO_8_LANES
  return false;
#else
  return true;
#endif
}

// For the tests: sort's values and indices along the last dimension, every row by the 8-lane
// network that AVX-512 CPUs run, here compiled for AVX2, so that its logic is checked on CPUs
// without AVX-512 too. float32, int32 and the 16-bit dtypes take the vector paths, the 8-bit ones
// the scalar codec, int64 and float64 the wide-key rows (see [Note: wide keys]).
std::tuple<at::Tensor, at::Tensor> sort_rows_8_lanes(const at::Tensor& self, bool descending) {
  TORCH_CHECK(sort_rows_8_lanes_built(),
              "poptorch_sim::_sort_rows_8_lanes: this library was built without the 8-lane network "
              "(the CPU that built it has AVX-512 and runs that variant itself); build it with "
              "POPTORCH_SIM_BUILD_8_LANES=1 python setup.py build_ext --inplace to have it");
  check_sortable(self, "_sort_rows_8_lanes");
  TORCH_CHECK(simd::supported() >= simd::Level::kAvx2,
              "poptorch_sim::_sort_rows_8_lanes: needs a CPU with AVX2, this one has ",
              simd::name(simd::supported()));
  const at::Tensor input = self.contiguous();
  const int64_t n = input.dim() == 0 ? 1 : input.size(-1);
  TORCH_CHECK(n <= kBitonicRowMax, "poptorch_sim::_sort_rows_8_lanes: rows of at most ",
              kBitonicRowMax, " items, got ", n);
  at::Tensor values = empty_tensor_like(input);
  at::Tensor indices = empty_tensor(input.sizes(), input.options().dtype(at::kLong));
  if (input.numel() == 0) {
    return {values, indices};
  }
#ifndef POPTORCH_SIM_NO_8_LANES
  dispatch_sort_type(input.scalar_type(), "_sort_rows_8_lanes", [&](auto scalar_tag,
                                                                    auto codec_tag) {
    using scalar_t = decltype(scalar_tag);
    using Codec = decltype(codec_tag);
    RowSort<scalar_t> sort_rows;
    if constexpr (bitonic::kWideKeys<scalar_t>) {
      sort_rows = &bitonic::sort_wide_rows_8_lanes_avx2<Codec, scalar_t>;
    } else {
      sort_rows = &bitonic::sort_rows_8_lanes_avx2<Codec, scalar_t>;
    }
    KernelScope scope("sort");
    sort_rows_bitonic<Codec>(input.const_data_ptr<scalar_t>(), input.numel() / n, n,
                             descending ? 0xffffffffu : 0u, values.mutable_data_ptr<scalar_t>(),
                             indices.mutable_data_ptr<int64_t>(), scope, sort_rows);
  });
#endif
  return {values, indices};
}

}  // namespace sorting
}  // namespace poptorch_sim
