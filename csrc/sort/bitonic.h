// The bitonic sorting network: whole short rows, and the in-cache base case of the long-row sorts.
//
// [Note: bitonic network]
// A bitonic sorting network sorts P = 2^p items in p(p+1)/2 steps; each step compares and
// exchanges P/2 fixed pairs of items, with no branch depending on the data, so every step is a
// few vector instructions per W items (W = 8 lanes of 64 bits with AVX-512, 4 with AVX2, 2 in
// the baseline build). It sorts the packed items of [Note: sort keys] (key << 32 | index): they
// are all distinct, so the network's result is the one sorted order, the order a stable sort
// gives, and every SIMD variant yields the same bits. The network holds them laid out as
// doubles (see [Note: items as doubles]); rows are padded to a power of two (and to at least 2W)
// with kPad, which sorts after every item.
//
// Merge stage k (k = 2, 4, ..., P) first compares item i of each block of k with its mirror
// (block + k - 1 - i), then runs half-cleaners of distance k/4, ..., 1. A step of distance at
// least W pairs whole vectors (the mirror step reverses one of them); steps of distance below W
// pair lanes of one vector, and all of them for one stage run on a vector while it sits in a
// register. With AVX2 and the baseline, those lane steps run on two vectors at once: their lanes
// are regrouped (two permutes before each step) so that each lane step becomes a minimum and a
// maximum of whole vectors, and put back after the last one (see lane_cleaners_pair: 12
// instructions for both steps on two vectors, where one vector at a time took 16). With AVX-512
// the three lane steps run on two vectors at once the same way (lane_cleaners_pair8: 8
// two-vector permutes and 6 minima and maxima, where one vector at a time took 12 instructions
// per vector). The first log2(W) stages sort each vector on its own, or in a block of W vectors
// sort its W columns and transpose them (sort_block).
//
// Rows of at least W * kRun items first sort runs of up to kColumnMax items by column chunks,
// comparing whole vectors only (see [Note: column chunks] in bitonic/steps.inc, and [Note:
// column networks]); the stages up to a block of 8 vectors run on the block held in registers,
// and so do the last steps of every later stage (all of distance below the block): only the
// steps of longer distance go through memory, up to three of them per pass over the row (the
// mirror step with the first one or two half-cleaners: the 4 or 8 vectors those compare are
// closed under all of them). At 4096 items that is 19 passes instead of 26.
//
// Rows of up to kBitonicRowMax items (sort.cpp) are sorted whole by the network, one tile per
// group of rows (rows of at most kRun items W at a time, by columns), the longest ones and those
// padded by a fifth or more cut first into pieces by quicksort partitions (see [Note: partitioned
// rows] in bitonic/pieces.inc); groups of the scatter sort
// and tiles' slices of up to kBitonicBaseMax items use it as their base case. Both limits were
// chosen by measurement (benchmarks/RESULTS.md, "Short rows"). Float32, int32, float16, bfloat16
// and int16 rows make their items and write their values 2W at a time; int8 and uint8 one at a
// time through their codec; int64 and float64 rows through a 32-bit window of their keys (see
// [Note: wide keys] in bitonic/row_loops.inc). With AVX2 and AVX-512, rows of 16-bit keys longer
// than kRun are sorted as 32-bit items instead, twice the lanes per vector (see [Note: 16-bit
// keys] in bitonic/narrow_rows.inc), and so are float32 and int32 rows of 64 < n <= 1024 and
// int64 and float64 rows of kRun < n <= 1024, their items holding a window of the key (see
// [Note: windowed 32-bit items] in bitonic/window_rows.inc).
#pragma once

#include <cstdint>

#include "common/simd.h"
#include "sort/bitonic/items.h"
#include "sort/bitonic/network.h"
#include "sort/bitonic/rows.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

// Longest run the long-row sorts hand to the network as their base case.
constexpr int64_t kBitonicBaseMax = 64;

// Sorts rows [row_lo, row_hi) of n values of scalar_t from `in` (flip: all ones for a descending
// sort) and writes their values (unless null) and indices; buf has room for rows_buffer_size(n)
// items. sort_rows takes every dtype but int64 and float64, sort_wide_rows those two (see [Note:
// wide keys]). One variant per SIMD level (see [Note: SIMD variants] in common/simd.h), and the
// 8-lane network compiled for AVX2 (see [Note: split 8-lane vectors]), so that the AVX-512
// variant's logic runs in the tests on CPUs without AVX-512 (sort_rows_8_lanes in sort.cpp); each
// is defined in its own file (see [Note: one file per variant] in bitonic/variants.h).
#define POPSIM_BITONIC_DECLARE(SUFFIX, ATTRIBUTE)                                             \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE void sort_rows##SUFFIX(                                                           \
      const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,           \
      scalar_t* values, int64_t* indices, int64_t* buf);                                      \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE void sort_wide_rows##SUFFIX(                                                      \
      const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,           \
      scalar_t* values, int64_t* indices, int64_t* buf);
POPSIM_BITONIC_DECLARE(_avx512, POPSIM_AVX512)
POPSIM_BITONIC_DECLARE(_avx2, POPSIM_AVX2)
POPSIM_BITONIC_DECLARE(_base, )
POPSIM_BITONIC_DECLARE(_8_lanes_avx2, POPSIM_AVX2)
#undef POPSIM_BITONIC_DECLARE

// Sorts packed items[0, n), given in index order, ascending in place with SIMD variant `level`'s
// network; n is at most kBitonicBaseMax. Defined in bitonic.cpp.
void sort_small(uint64_t* items, int64_t n, simd::Level level);

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
