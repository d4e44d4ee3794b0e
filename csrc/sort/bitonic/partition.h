// Partitions of network items around a pivot, W at a time: the quicksort steps that cut long rows
// into pieces the network sorts (see [Note: partitioned rows] in bitonic/pieces.inc).
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <utility>

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

// The 32-bit lane permutation that moves the 64-bit lanes of a 4-lane vector outside `mask`
// first and those in it last, each group in lane order: kPartitionPermutes[mask][0..7].
constexpr std::array<std::array<int32_t, 8>, 16> partition_permutes() {
  std::array<std::array<int32_t, 8>, 16> table{};
  for (int mask = 0; mask < 16; ++mask) {
    int out = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (int lane = 0; lane < 4; ++lane) {
        if (((mask >> lane) & 1) == pass) {
          table[mask][2 * out] = 2 * lane;
          table[mask][2 * out + 1] = 2 * lane + 1;
          ++out;
        }
      }
    }
  }
  return table;
}
alignas(32) inline constexpr std::array<std::array<int32_t, 8>, 16> kPartitionPermutes =
    partition_permutes();

// The median of 9 items spread over x[0, n) (n >= 9): the pivot of a partition. Items are
// distinct, so at least 4 items lie below it and 4 above.
inline int64_t choose_pivot(const int64_t* x, int64_t n) {
  int64_t sample[9];
  for (int i = 0; i < 9; ++i) {
    sample[i] = x[(n - 1) * i / 8];
  }
  for (int i = 1; i < 9; ++i) {  // insertion sort
    const int64_t item = sample[i];
    int j = i;
    for (; j > 0 && sample[j - 1] > item; --j) {
      sample[j] = sample[j - 1];
    }
    sample[j] = item;
  }
  return sample[4];
}

// Partitions src[0, n) around pivot into dst[0, n) one item at a time (the baseline variant's
// partition): the items below pivot to the front, the others to the back; returns how many went
// to the front.
inline int64_t partition_scalar(const int64_t* src, int64_t n, int64_t pivot, int64_t* dst) {
  int64_t low = 0;
  int64_t high = n;
  for (int64_t i = 0; i < n; ++i) {  // branch-free: each item is written at both ends
    const int64_t item = src[i];
    const bool below = item < pivot;
    dst[low] = item;
    dst[high - 1] = item;
    low += below;
    high -= !below;
  }
  return low;
}

// The vector partitions, one per SIMD level, each compiled for its own target (intrinsics need it
// on every function they are inlined into): partition.inc's loop over the lane operations of
// namespace avx2_lanes or avx512_lanes.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2_lanes {
constexpr int kLanes = 4;
using Vector = __m256d;

inline __attribute__((always_inline)) Vector load(const int64_t* p) {
  return _mm256_loadu_pd(reinterpret_cast<const double*>(p));
}

inline __attribute__((always_inline)) Vector broadcast(int64_t item) {
  return _mm256_castsi256_pd(_mm256_set1_epi64x(item));
}

// Stores v's items below pivot (as doubles: see [Note: items as doubles]) at left and the others
// ending at right_end, each group in lane order, as one permute and two whole-vector stores: the
// rest of each store lands on room not yet written (see partition_into). Returns how many items
// went right.
inline __attribute__((always_inline)) int split_store(Vector v, Vector pivot, int64_t* left,
                                                      int64_t* right_end) {
  const int high = _mm256_movemask_pd(_mm256_cmp_pd(v, pivot, _CMP_GE_OQ));
  const __m256i permute =
      _mm256_load_si256(reinterpret_cast<const __m256i*>(kPartitionPermutes[high].data()));
  const Vector split =
      _mm256_castsi256_pd(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(v), permute));
  _mm256_storeu_pd(reinterpret_cast<double*>(left), split);
  _mm256_storeu_pd(reinterpret_cast<double*>(right_end - kLanes), split);
  return __builtin_popcount(high);
}

#include "sort/bitonic/partition.inc"
}  // namespace avx2_lanes
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
namespace avx512_lanes {
constexpr int kLanes = 8;
using Vector = __m512d;

inline __attribute__((always_inline)) Vector load(const int64_t* p) {
  return _mm512_loadu_pd(reinterpret_cast<const double*>(p));
}

inline __attribute__((always_inline)) Vector broadcast(int64_t item) {
  return _mm512_castsi512_pd(_mm512_set1_epi64(item));
}

// As avx2_lanes::split_store: each group compressed in a register (vcompresspd with a memory
// destination is microcoded on AMD Zen 4) and stored whole on the left, masked on the right.
inline __attribute__((always_inline)) int split_store(Vector v, Vector pivot, int64_t* left,
                                                      int64_t* right_end) {
  const __mmask8 high = _mm512_cmp_pd_mask(v, pivot, _CMP_GE_OQ);
  const int count = __builtin_popcount(high);
  _mm512_storeu_pd(reinterpret_cast<double*>(left),
                   _mm512_maskz_compress_pd(static_cast<__mmask8>(~high), v));
  _mm512_mask_storeu_pd(reinterpret_cast<double*>(right_end - count),
                        static_cast<__mmask8>((1u << count) - 1),
                        _mm512_maskz_compress_pd(high, v));
  return count;
}

#include "sort/bitonic/partition.inc"
}  // namespace avx512_lanes
#pragma GCC pop_options

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
