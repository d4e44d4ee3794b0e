// The scatter sort of one long row across tiles, and the per-dtype loops it calls.
// See [Note: sort keys] in sort.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "common/simd.h"
#include "sort/sort.h"

namespace poptorch_sim {
namespace sorting {

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
//             groups' places (the exchange; see [Note: two-step scatter])
//   5 sort    groups are dealt out to tiles by position; each tile radix-sorts each group in
//             its cache and writes the group's values and int64 indices out (the write-out,
//             counted as a superstep of its own, runs fused into this one)
// Making the keys twice costs less than storing and re-reading them, and the group's values
// and indices go out in order from the tile's cache, never scattered to memory. A group that is one huge
// digit (keys bunched below the digit) would leave one tile with most of the work; then the
// row goes back to per-tile sorts and merges.

// Fills keys[0, hi - lo) with the sort keys of elements [lo, hi) (complemented when
// descending); returns the OR of the bits in which they differ from element 0's key.
using KeyChunk = std::function<uint32_t(int64_t lo, int64_t hi, uint32_t* keys)>;
// Writes `count` sorted items (key << 32 | index) out as output elements [pos, pos + count).
using Emit = std::function<void(const uint64_t* items, int64_t count, int64_t pos)>;

// The scatter sort of one row of n elements, exchanging through `items` (n entries), its groups'
// base cases in SIMD variant `level`. Returns false, having written nothing, when the keys are
// too skewed to spread over the tiles.
bool scatter_sort_row(
    int64_t n, int64_t tiles, KernelScope& scope, uint64_t* items, const KeyChunk& keys,
    const Emit& emit, simd::Level level);

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

// The same loops compiled for each SIMD level (see [Note: SIMD variants] in common/simd.h).
#define POPSIM_SORT_LOOPS(SUFFIX, ATTRIBUTE)                                                  \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE void write_items##SUFFIX(                                                         \
      const uint64_t* items, int64_t count, const scalar_t* in, uint32_t flip, bool gather,   \
      scalar_t* values, int64_t* indices) {                                                   \
    write_items<Codec>(items, count, in, flip, gather, values, indices);                      \
  }                                                                                           \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE uint32_t make_keys##SUFFIX(                                                       \
      const scalar_t* in, int64_t count, uint32_t flip, uint32_t reference, uint32_t* keys,   \
      uint32_t& flags) {                                                                      \
    return make_keys<Codec>(in, count, flip, reference, keys, flags);                         \
  }
POPSIM_SORT_LOOPS(_avx512, POPSIM_AVX512)
POPSIM_SORT_LOOPS(_avx2, POPSIM_AVX2)
POPSIM_SORT_LOOPS(_base, )
#undef POPSIM_SORT_LOOPS

// The scatter sort of one row of packed items in SIMD variant `level`, writing values (unless
// null) and indices.
template <typename Codec, typename scalar_t>
bool scatter_sort_into(
    const scalar_t* in, int64_t n, uint32_t flip, int64_t tiles, KernelScope& scope,
    uint64_t* items, scalar_t* values, int64_t* indices, simd::Level level) {
  std::atomic<uint32_t> flags{0};
  uint32_t unused = 0;
  const uint32_t reference = Codec::key(in[0], unused) ^ flip;
  const auto make_keys_variant = simd::pick(level, &make_keys_avx512<Codec, scalar_t>,
                                            &make_keys_avx2<Codec, scalar_t>,
                                            &make_keys_base<Codec, scalar_t>);
  const auto write_items_variant = simd::pick(level, &write_items_avx512<Codec, scalar_t>,
                                              &write_items_avx2<Codec, scalar_t>,
                                              &write_items_base<Codec, scalar_t>);
  const KeyChunk keys = [&](int64_t lo, int64_t hi, uint32_t* out) {
    uint32_t local = 0;
    const uint32_t diff = make_keys_variant(in + lo, hi - lo, flip, reference, out, local);
    if (local != 0) {
      flags.fetch_or(local, std::memory_order_relaxed);
    }
    return diff;
  };
  const Emit emit = [&](const uint64_t* sorted, int64_t count, int64_t pos) {
    const bool gather = flags.load(std::memory_order_relaxed) != 0;
    scalar_t* out = values ? values + pos : nullptr;
    write_items_variant(sorted, count, in, flip, gather, out, indices + pos);
  };
  return scatter_sort_row(n, tiles, scope, items, keys, emit, level);
}

}  // namespace sorting
}  // namespace poptorch_sim
