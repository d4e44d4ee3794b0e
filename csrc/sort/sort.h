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
// float16 keys are the same map on the 16 bits, in the high half of 32 (half_key).
//
// Torch-free (c10's scalar types only), as is every header the kernels' files include, so that
// the SIMD variants' files do not parse ATen: the functions taking tensors are declared in
// sort_dispatch.h. See [Note: kernels without torch's headers] in setup.py.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "engine/tile_engine.h"
#include "sort/bitonic.h"

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

// float16 keys: the value's 16-bit order-preserving key (as float_key makes it for float32) in
// the high half, so that the network's vector code makes them from the bits alone, 2W at a time
// (item_vectors.inc; float16 has no conversion to float32 in AVX2). NaN -> 0xffff0000.
inline uint32_t half_key(c10::Half v, uint32_t& flags) {
  const uint32_t bits = v.x;
  const bool is_nan = (bits & 0x7fffu) > 0x7c00u;
  const bool neg_zero = bits == 0x8000u;
  flags |= static_cast<uint32_t>(is_nan | neg_zero);
  const uint32_t b = neg_zero ? 0u : bits;
  const uint32_t key = (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
  return (is_nan ? 0xffffu : key) << 16;
}

inline c10::Half half_from_key(uint32_t key) {
  const uint32_t k = key >> 16;
  const uint32_t bits = (k & 0x8000u) ? (k ^ 0x8000u) : (~k & 0xffffu);
  return c10::Half(static_cast<uint16_t>(bits), c10::Half::from_bits());
}

// Codec for values of at most 32 bits: item = key << 32 | index.
template <typename scalar_t>
struct Codec32 {
  using Item = uint64_t;
  static constexpr bool kIsFloat = !std::is_integral<scalar_t>::value;
  static Item sentinel() { return ~uint64_t{0}; }
  static uint32_t key(scalar_t v, uint32_t& flags) {
    if constexpr (std::is_same<scalar_t, c10::Half>::value) {
      return half_key(v, flags);
    } else if constexpr (kIsFloat) {
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
    if constexpr (std::is_same<scalar_t, c10::Half>::value) {
      return half_from_key(k);
    } else if constexpr (kIsFloat) {
      return static_cast<scalar_t>(float_from_key(k));
    } else {
      return static_cast<scalar_t>(static_cast<int32_t>(k ^ 0x80000000u));
    }
  }
  static void local_sort(Item* items, Item* scratch, int64_t n, simd::Level level);
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
  static void local_sort(Item* items, Item* /*scratch*/, int64_t n, simd::Level /*level*/) {
    std::sort(items, items + n);
  }
};

// Sorts packed items whose low words are already ascending (as built) by their high words:
// radix sort with digits of at most 12 bits, skipping digits every item shares; its base cases
// in SIMD variant `level`.
void radix_sort_high_words(uint64_t* items, uint64_t* scratch, int64_t n, simd::Level level);

template <typename scalar_t>
void Codec32<scalar_t>::local_sort(Item* items, Item* scratch, int64_t n, simd::Level level) {
  if (n <= bitonic::kBitonicBaseMax) {
    bitonic::sort_small(items, n, level);
  } else if (n <= 256) {
    std::sort(items, items + n);
  } else {
    radix_sort_high_words(items, scratch, n, level);
  }
}

// The kernel family (see [Note: measured variants] in common/simd.h) of the bitonic sort of rows
// of n items of scalar_t (n at most 2^15, sort.cpp's kBitonicRowMax): by row length class and
// key width. 8-bit keys count as 32-bit ones: they make the same packed items.
template <typename scalar_t>
simd::Family row_sort_family(int64_t n) {
  using simd::Family;
  static_assert(static_cast<int>(Family::kSortRows32768Bits64) ==
                    static_cast<int>(Family::kSortRows16Bits16) + 14,
                "row sort families: 5 length classes of 3 key widths, in that order");
  constexpr int width = sizeof(scalar_t) == 2 ? 0 : sizeof(scalar_t) == 8 ? 2 : 1;
  const int length = n <= 16 ? 0 : n <= 256 ? 1 : n <= 1024 ? 2 : n <= 4096 ? 3 : 4;
  return static_cast<Family>(static_cast<int>(Family::kSortRows16Bits16) + 3 * length + width);
}

// The kernel family of the sorts of rows longer than the bitonic network's of at most 32-bit
// values of scalar_t (64-bit ones have no SIMD variants there: their items are sorted and merged
// by scalar code).
template <typename scalar_t>
constexpr simd::Family long_sort_family() {
  static_assert(sizeof(scalar_t) <= 4, "no SIMD variants of the long-row sort of 64-bit keys");
  return sizeof(scalar_t) == 2 ? simd::Family::kSortLongBits16 : simd::Family::kSortLongBits32;
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

// Sorts one row over `tiles` tiles: each tile builds and sorts the items of its slice
// (superstep 1, in SIMD variant `level`), then ceil(log2 tiles) merge supersteps follow. Returns
// the buffer holding the result.
template <typename Codec, typename scalar_t>
typename Codec::Item* tile_sort_row(
    const scalar_t* in, int64_t n, uint32_t flip, int64_t tiles, KernelScope& scope,
    typename Codec::Item* buf, typename Codec::Item* scratch, uint32_t& flags,
    simd::Level level) {
  tiles = std::max<int64_t>(1, std::min(tiles, (n + 15) / 16));
  std::atomic<uint32_t> shared_flags{0};
  scope.superstep(tiles, [&](int64_t tile) {
    const int64_t lo = split_point(n, tiles, tile);
    const int64_t hi = split_point(n, tiles, tile + 1);
    uint32_t local = 0;
    for (int64_t i = lo; i < hi; ++i) {
      buf[i] = Codec::make(in[i], i, flip, local);
    }
    Codec::local_sort(buf + lo, scratch + lo, hi - lo, level);
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

}  // namespace sorting
}  // namespace poptorch_sim
