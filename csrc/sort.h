// Sorting on the tile engine: order-preserving keys, per-tile sorts and cross-tile merges.
//
// [Note: sort keys]
// Every element becomes an item that compares as an unsigned integer in the order torch.sort
// wants: its value mapped to an order-preserving unsigned key (floats: flip the sign bit of
// positives and all bits of negatives; NaN of either sign -> all ones so it sorts last; -0.0 ->
// +0.0 so the two zeros tie), the key complemented for a descending sort, and the element's
// index as a tie-breaker. Items are therefore all distinct and the sort is stable: equal values
// keep their input order, as torch.sort(stable=True) does. Values of 32 bits or fewer pack key
// and index into one uint64 (key << 32 | index); 64-bit values use a {key, index} pair.
// Values are read back from the key when the row holds no NaN or -0.0 (exact), else gathered.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>

#include "tile_engine.h"

namespace poptorch_sim {
namespace sorting {

using engine::KernelScope;
using engine::split_point;

// Bits set in a row's "inexact" flags when the key cannot be turned back into the value.
constexpr uint32_t kNeedsGather = 1;

inline uint32_t float_key(float v, uint32_t& flags) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const bool neg_zero = bits == 0x80000000u;
  flags |= static_cast<uint32_t>(is_nan | neg_zero);
  bits = neg_zero ? 0u : bits;
  const uint32_t key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return is_nan ? 0xffffffffu : key;
}

inline float float_from_key(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key ^ 0x80000000u) : ~key;
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

inline uint64_t double_key(double v, uint32_t& flags) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint64_t sign = uint64_t{1} << 63;
  const bool is_nan = (bits & ~sign) > 0x7ff0000000000000ull;
  const bool neg_zero = bits == sign;
  flags |= static_cast<uint32_t>(is_nan | neg_zero);
  bits = neg_zero ? 0u : bits;
  const uint64_t key = (bits & sign) ? ~bits : (bits | sign);
  return is_nan ? ~uint64_t{0} : key;
}

inline double double_from_key(uint64_t key) {
  const uint64_t sign = uint64_t{1} << 63;
  const uint64_t bits = (key & sign) ? (key ^ sign) : ~key;
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// Codec for values of at most 32 bits: item = key << 32 | index.
template <typename scalar_t>
struct Codec32 {
  using Item = uint64_t;
  static constexpr bool kIsFloat = !std::is_integral<scalar_t>::value;
  static Item sentinel() { return ~uint64_t{0}; }
  static uint32_t key(scalar_t v, uint32_t& flags) {
    if constexpr (kIsFloat) {
      return float_key(static_cast<float>(v), flags);
    } else {
      return static_cast<uint32_t>(static_cast<int32_t>(v)) ^ 0x80000000u;
    }
  }
  static Item make(scalar_t v, int64_t index, uint32_t flip, uint32_t& flags) {
    return (static_cast<uint64_t>(key(v, flags) ^ flip) << 32) | static_cast<uint64_t>(index);
  }
  static int64_t index(Item item) { return static_cast<int64_t>(item & 0xffffffffu); }
  static scalar_t value(Item item, uint32_t flip) {
    const uint32_t k = static_cast<uint32_t>(item >> 32) ^ flip;
    if constexpr (kIsFloat) {
      return static_cast<scalar_t>(float_from_key(k));
    } else {
      return static_cast<scalar_t>(static_cast<int32_t>(k ^ 0x80000000u));
    }
  }
  static void local_sort(Item* items, Item* scratch, int64_t n);
};

// Codec for 64-bit values: item = {key, index}.
struct KeyIndex {
  uint64_t key;
  int64_t index;
  bool operator<(const KeyIndex& other) const {
    return key < other.key || (key == other.key && index < other.index);
  }
};

template <typename scalar_t>
struct Codec64 {
  using Item = KeyIndex;
  static Item sentinel() { return {~uint64_t{0}, INT64_MAX}; }
  static Item make(scalar_t v, int64_t index, uint32_t flip, uint32_t& flags) {
    const uint64_t wide_flip = flip ? ~uint64_t{0} : 0;
    if constexpr (std::is_integral<scalar_t>::value) {
      return {(static_cast<uint64_t>(v) ^ (uint64_t{1} << 63)) ^ wide_flip, index};
    } else {
      return {double_key(static_cast<double>(v), flags) ^ wide_flip, index};
    }
  }
  static int64_t index(const Item& item) { return item.index; }
  static scalar_t value(const Item& item, uint32_t flip) {
    const uint64_t k = item.key ^ (flip ? ~uint64_t{0} : 0);
    if constexpr (std::is_integral<scalar_t>::value) {
      return static_cast<scalar_t>(k ^ (uint64_t{1} << 63));
    } else {
      return static_cast<scalar_t>(double_from_key(k));
    }
  }
  static void local_sort(Item* items, Item* /*scratch*/, int64_t n) { std::sort(items, items + n); }
};

// Sorts packed items whose low words are already ascending (as built) by their high words:
// radix sort with digits of at most 12 bits, skipping digits every item shares.
void radix_sort_high_words(uint64_t* items, uint64_t* scratch, int64_t n);

template <typename scalar_t>
void Codec32<scalar_t>::local_sort(Item* items, Item* scratch, int64_t n) {
  if (n > 48 && n <= 256) {
    std::sort(items, items + n);
  } else {
    radix_sort_high_words(items, scratch, n);
  }
}

// Merges two sorted runs starting at output rank `lo` for `count` items (merge path).
template <typename Item>
void merge_range(
    const Item* a, int64_t len_a, const Item* b, int64_t len_b, int64_t lo, int64_t count,
    Item* out) {
  int64_t low = std::max<int64_t>(0, lo - len_b);
  int64_t high = std::min(lo, len_a);
  while (low < high) {
    const int64_t mid = (low + high) / 2;
    if (a[mid] < b[lo - 1 - mid]) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  int64_t i = low;
  int64_t j = lo - low;
  for (int64_t k = 0; k < count; ++k) {
    const bool take_a = j >= len_b || (i < len_a && a[i] < b[j]);
    out[k] = take_a ? a[i] : b[j];
    i += take_a;
    j += !take_a;
  }
}

// One superstep: merges neighbouring runs pairwise (bounds: run starts plus n) from `src` into
// `dst`, every tile producing an equal share of the output.
template <typename Item>
void merge_round(
    const Item* src, Item* dst, const std::vector<int64_t>& bounds, int64_t tiles,
    KernelScope& scope) {
  const int64_t runs = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t n = bounds.back();
  scope.superstep(tiles, [&](int64_t tile) {
    const int64_t out_lo = split_point(n, tiles, tile);
    const int64_t out_hi = split_point(n, tiles, tile + 1);
    for (int64_t pair = 0; pair * 2 < runs; ++pair) {
      const int64_t start = bounds[pair * 2];
      const int64_t mid = bounds[std::min(pair * 2 + 1, runs)];
      const int64_t stop = bounds[std::min(pair * 2 + 2, runs)];
      const int64_t lo = std::max(start, out_lo);
      const int64_t hi = std::min(stop, out_hi);
      if (lo >= hi) {
        continue;
      }
      merge_range(src + start, mid - start, src + mid, stop - mid, lo - start, hi - lo, dst + lo);
    }
  }, n);
  scope.add_compare_exchanges(n);
  scope.add_bytes_exchanged(n * static_cast<int64_t>(sizeof(Item)));
}

template <typename Item>
Item* merge_tiles(Item* buf, Item* scratch, int64_t n, int64_t tiles, KernelScope& scope);

// Rows at least this long take the scatter sort when spread over several tiles.
constexpr int64_t kScatterSortMin = int64_t{1} << 16;

// [Note: scatter sort]
// One row of at most 32-bit values spread over T tiles in five supersteps, one of them a real
// exchange:
//   1 build   each tile makes the keys of its slice, noting which key bits differ
//   2 count   each tile counts its keys by the 12-bit digit below the highest differing bit
//             (fused into 1 when that is the top digit, as it is with mixed signs)
//   3 (sync)  digit counts are summed; every digit is a group of its own (only runs of small
//             neighbouring digits share one), so a group has 12 key bits fewer left to sort;
//             every tile learns where its items of each group go (tile order keeps it stable)
//   4 scatter each tile makes its keys again and sends (key, 32-bit index) items to their
//             groups' places (the exchange), through cache-line write-combining buffers
//   5 sort    groups are dealt out to tiles by position; each tile radix-sorts each group in
//             its cache and writes the group's values and int64 indices out (the write-out,
//             counted as a superstep of its own, runs fused into this one)
// Making the keys twice costs less than storing and re-reading them. A group that is one huge
// digit (keys bunched below the digit) would leave one tile with most of the work; then the
// row goes back to per-tile sorts and merges.

// Fills keys[0, hi - lo) with the sort keys of elements [lo, hi) (complemented when
// descending); returns the OR of the bits in which they differ from element 0's key.
using KeyChunk = std::function<uint32_t(int64_t lo, int64_t hi, uint32_t* keys)>;
// Writes `count` sorted items (key << 32 | index) out as output elements [pos, pos + count).
using Emit = std::function<void(const uint64_t* items, int64_t count, int64_t pos)>;

// The scatter sort of one row of n elements, exchanging through `items` (n entries). Returns
// false, having written nothing, when the keys are too skewed to spread over the tiles.
bool scatter_sort_row(
    int64_t n, int64_t tiles, KernelScope& scope, uint64_t* items, const KeyChunk& keys,
    const Emit& emit);

// Writes sorted items out as values and int64 indices, serially.
template <typename Codec, typename scalar_t>
inline __attribute__((always_inline)) void write_items(
    const typename Codec::Item* items, int64_t count, const scalar_t* in, uint32_t flip,
    bool gather, scalar_t* values, int64_t* indices) {
  if (values == nullptr) {
    for (int64_t i = 0; i < count; ++i) {
      indices[i] = Codec::index(items[i]);
    }
  } else if (gather) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t index = Codec::index(items[i]);
      indices[i] = index;
      values[i] = in[index];
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      indices[i] = Codec::index(items[i]);
      values[i] = Codec::value(items[i], flip);
    }
  }
}

// Makes the keys of in[0, count) (see KeyChunk); ORs the flags of inexact keys into `flags`.
template <typename Codec, typename scalar_t>
inline __attribute__((always_inline)) uint32_t make_keys(
    const scalar_t* in, int64_t count, uint32_t flip, uint32_t reference, uint32_t* keys,
    uint32_t& flags) {
  uint32_t local = 0;
  uint32_t diff = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t key = Codec::key(in[i], local) ^ flip;
    keys[i] = key;
    diff |= key ^ reference;
  }
  flags |= local;
  return diff;
}

// The same loops compiled for AVX2, taken when the CPU has it (see cpu_has_avx2).
template <typename Codec, typename scalar_t>
__attribute__((target("avx2"))) void write_items_avx2(
    const uint64_t* items, int64_t count, const scalar_t* in, uint32_t flip, bool gather,
    scalar_t* values, int64_t* indices) {
  write_items<Codec>(items, count, in, flip, gather, values, indices);
}

template <typename Codec, typename scalar_t>
__attribute__((target("avx2"))) uint32_t make_keys_avx2(
    const scalar_t* in, int64_t count, uint32_t flip, uint32_t reference, uint32_t* keys,
    uint32_t& flags) {
  return make_keys<Codec>(in, count, flip, reference, keys, flags);
}

// Whether this CPU runs AVX2 code (asked once).
bool cpu_has_avx2();

// The scatter sort of one row of packed items, writing values (unless null) and indices.
template <typename Codec, typename scalar_t>
bool scatter_sort_into(
    const scalar_t* in, int64_t n, uint32_t flip, int64_t tiles, KernelScope& scope,
    uint64_t* items, scalar_t* values, int64_t* indices) {
  std::atomic<uint32_t> flags{0};
  uint32_t unused = 0;
  const uint32_t reference = Codec::key(in[0], unused) ^ flip;
  const bool avx2 = cpu_has_avx2();
  const KeyChunk keys = [&](int64_t lo, int64_t hi, uint32_t* out) {
    uint32_t local = 0;
    const uint32_t diff =
        avx2 ? make_keys_avx2<Codec>(in + lo, hi - lo, flip, reference, out, local)
             : make_keys<Codec>(in + lo, hi - lo, flip, reference, out, local);
    if (local != 0) {
      flags.fetch_or(local, std::memory_order_relaxed);
    }
    return diff;
  };
  const Emit emit = [&](const uint64_t* sorted, int64_t count, int64_t pos) {
    const bool gather = flags.load(std::memory_order_relaxed) != 0;
    scalar_t* out = values ? values + pos : nullptr;
    if (avx2) {
      write_items_avx2<Codec>(sorted, count, in, flip, gather, out, indices + pos);
    } else {
      write_items<Codec>(sorted, count, in, flip, gather, out, indices + pos);
    }
  };
  return scatter_sort_row(n, tiles, scope, items, keys, emit);
}

// Sorts one row over `tiles` tiles: each tile builds and sorts the items of its slice
// (superstep 1), then ceil(log2 tiles) merge supersteps follow. Returns the buffer holding
// the result.
template <typename Codec, typename scalar_t>
typename Codec::Item* tile_sort_row(
    const scalar_t* in, int64_t n, uint32_t flip, int64_t tiles, KernelScope& scope,
    typename Codec::Item* buf, typename Codec::Item* scratch, uint32_t& flags) {
  tiles = std::max<int64_t>(1, std::min(tiles, (n + 15) / 16));
  std::atomic<uint32_t> shared_flags{0};
  scope.superstep(tiles, [&](int64_t tile) {
    const int64_t lo = split_point(n, tiles, tile);
    const int64_t hi = split_point(n, tiles, tile + 1);
    uint32_t local = 0;
    for (int64_t i = lo; i < hi; ++i) {
      buf[i] = Codec::make(in[i], i, flip, local);
    }
    Codec::local_sort(buf + lo, scratch + lo, hi - lo);
    shared_flags.fetch_or(local, std::memory_order_relaxed);
  }, n);
  flags |= shared_flags.load();
  const double chunk = static_cast<double>(n) / static_cast<double>(tiles);
  scope.add_compare_exchanges(
      static_cast<int64_t>(static_cast<double>(n) * std::max(1.0, std::log2(chunk))));
  return merge_tiles(buf, scratch, n, tiles, scope);
}

// Merges the tiles' sorted slices pairwise, ceil(log2 tiles) supersteps; returns the result.
template <typename Item>
Item* merge_tiles(Item* buf, Item* scratch, int64_t n, int64_t tiles, KernelScope& scope) {
  std::vector<int64_t> bounds;
  for (int64_t tile = 0; tile <= tiles; ++tile) {
    bounds.push_back(split_point(n, tiles, tile));
  }
  Item* src = buf;
  Item* dst = scratch;
  while (bounds.size() > 2) {
    merge_round(src, dst, bounds, tiles, scope);
    std::vector<int64_t> next;
    for (size_t i = 0; i < bounds.size() - 1; i += 2) {
      next.push_back(bounds[i]);
    }
    next.push_back(n);
    bounds.swap(next);
    std::swap(src, dst);
  }
  return src;
}

// Writes sorted items of one row out as values and int64 indices, over `tiles` tiles.
template <typename Codec, typename scalar_t>
void write_sorted(
    const typename Codec::Item* items, int64_t count, const scalar_t* in, uint32_t flip,
    bool gather, scalar_t* values, int64_t* indices, int64_t tiles, KernelScope* scope) {
  auto body = [&](int64_t lo, int64_t hi) {
    write_items<Codec>(items + lo, hi - lo, in, flip, gather, values ? values + lo : nullptr,
                       indices + lo);
  };
  if (scope == nullptr || tiles <= 1 || count < 4096) {
    body(0, count);
    return;
  }
  scope->superstep(tiles, [&](int64_t tile) {
    body(split_point(count, tiles, tile), split_point(count, tiles, tile + 1));
  }, count);
}

// torch.sort over the last dim of a contiguous [rows, n] tensor, into contiguous outputs.
// `values` may be undefined (argsort).
void sort_last_dim(
    const at::Tensor& input, bool descending, at::Tensor values, at::Tensor indices,
    KernelScope& scope);

// Dtypes the sorting family accepts, for error messages.
const char* supported_dtypes_message();
bool is_supported_dtype(at::ScalarType type);

}  // namespace sorting
}  // namespace poptorch_sim
