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
// instructions for both steps on two vectors, where one vector at a time took 16). The first
// log2(W) stages sort each vector on its own.
//
// Rows of at least W * kRun items first sort their runs of kRun items by columns (see [Note:
// column networks]); the stages up to a block of 8 vectors run on the block held in registers,
// and so do the last steps of every later stage (all of distance below the block): only the
// steps of longer distance go through memory, up to three of them per pass over the row (the
// mirror step with the first one or two half-cleaners: the 4 or 8 vectors those compare are
// closed under all of them). At 4096 items that is 19 passes instead of 26.
//
// Rows of up to kBitonicRowMax items (sort.cpp) are sorted whole by the network, one tile per
// group of rows (rows of at most kRun items W at a time, by columns); groups of the scatter sort
// and tiles' slices of up to kBitonicBaseMax items use it as their base case. Both limits were
// chosen by measurement (README "Figures"). Float32 and int32 rows make their items and write
// their values 2W at a time; the other dtypes one at a time through their codec.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "common/simd.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

// Longest run the long-row sorts hand to the network as their base case.
constexpr int64_t kBitonicBaseMax = 64;

// [Note: items as doubles]
// The network compares items with the floating-point minimum and maximum (vminpd and vmaxpd:
// two instructions per W pairs, where 64-bit integers take a compare and two blends, AVX2 having
// no 64-bit integer minimum). Positive normal doubles order as their bit patterns do, so the
// network lays a packed item (key << 32 | index) out as one: the exponent of 2.0, the 32-bit key,
// then the index in 20 bits (kExponent | key << 20 | index, a double in [2, 4)). Whole rows
// therefore reach the network only up to 2^20 items (kBitonicRowMax is far below that), and the
// base case gives its items local indices (sort_items). Padding is 4.0, above every item.
constexpr int kIndexBits = 20;
constexpr int64_t kIndexMask = (int64_t{1} << kIndexBits) - 1;
constexpr int64_t kExponent = int64_t{0x400} << 52;  // 2.0
constexpr int64_t kPad = int64_t{0x401} << 52;       // 4.0: a padding item, after every real item

// The network item of a packed item (key << 32 | index, index below 2^20), and back.
constexpr int64_t network_item(uint64_t packed) {
  return kExponent | static_cast<int64_t>(packed >> 32 << kIndexBits) |
         static_cast<int64_t>(packed & kIndexMask);
}
constexpr uint64_t packed_item(int64_t item) {
  return (static_cast<uint64_t>(item) >> kIndexBits & 0xffffffff) << 32 |
         static_cast<uint64_t>(item & kIndexMask);
}

// Items the network sorts for a row of n: the power of two at least max(n, 2 * lanes).
constexpr int64_t padded_size(int64_t n, int lanes) {
  int64_t size = 2 * lanes;
  while (size < n) {
    size *= 2;
  }
  return size;
}

template <int W>
struct Vec {
  typedef int64_t type __attribute__((vector_size(8 * W)));
  typedef uint64_t unsigned_type __attribute__((vector_size(8 * W)));
};
template <int W>
using V = typename Vec<W>::type;
template <int W>
struct Vec32 {
  typedef int32_t type __attribute__((vector_size(4 * W)));
  typedef uint32_t unsigned_type __attribute__((vector_size(4 * W)));
};
template <int W>
using V32 = typename Vec32<W>::type;
template <int W>
using U32 = typename Vec32<W>::unsigned_type;
template <int W>
using UV = typename Vec<W>::unsigned_type;
template <int W>
struct VecDouble {
  typedef double type __attribute__((vector_size(8 * W)));
};

#define POPSIM_INLINE inline __attribute__((always_inline))

// [Note: column networks]
// Short runs are sorted a different way: W runs at once, one per lane. The W x W blocks of the
// runs are transposed so that vector p holds item p of every run, a fixed sorting network (Batcher's
// odd-even merge sort: 63 comparators for 16 items, against the bitonic network's 80) then
// compares whole vectors (a compare and two blends per W pairs, no lane permutes), and the blocks
// are transposed back. Rows of at most kRun items are sorted this way W rows at a time; longer
// rows sort their runs of kRun items this way before the bitonic merges of the row.
constexpr int kRun = 16;

// The comparators of Batcher's odd-even merge sort for P items (P a power of two), in order.
template <int P>
constexpr int odd_even_size() {
  int count = 0;
  for (int p = 1; p < P; p *= 2) {
    for (int k = p; k >= 1; k /= 2) {
      for (int j = k % p; j + k < P; j += 2 * k) {
        for (int i = 0; i < std::min(k, P - j - k); ++i) {
          count += (i + j) / (2 * p) == (i + j + k) / (2 * p);
        }
      }
    }
  }
  return count;
}

template <int P>
constexpr std::array<std::pair<int, int>, odd_even_size<P>()> odd_even_pairs() {
  std::array<std::pair<int, int>, odd_even_size<P>()> pairs{};
  int count = 0;
  for (int p = 1; p < P; p *= 2) {
    for (int k = p; k >= 1; k /= 2) {
      for (int j = k % p; j + k < P; j += 2 * k) {
        for (int i = 0; i < std::min(k, P - j - k); ++i) {
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
            pairs[count++] = {i + j, i + j + k};
          }
        }
      }
    }
  }
  return pairs;
}

// Vectors a register block holds: half of AVX2's register file, the rest is for temporaries.
// (16 for AVX-512 spilled three times as many registers to the stack in GCC 12's code.)
constexpr int kBlockVectors = 8;

// Items a sort_rows buffer must hold for rows of n (any SIMD level).
constexpr int64_t rows_buffer_size(int64_t n) { return std::max<int64_t>(padded_size(n, 8), 8 * kRun); }

// Codecs whose items the loops below make and read back W at a time: float32 and int32.
template <typename scalar_t>
constexpr bool kVectorCodec = std::is_same<scalar_t, float>::value ||
                              std::is_same<scalar_t, int32_t>::value;

// [Note: streaming stores]
// A sort's outputs are written once and not read again by the kernel. Where a tile writes a lot
// of them, they go out with streaming stores, which skip reading each line into the cache before
// writing it: the batched short-row sorts run right after other work (torch.sort, in the
// benchmark) found their 12 MiB of outputs out of cache, and paid for that read as much as for
// the sort of 16-item rows itself. Rows of 256 were slower streamed, though (two threads: 1.97
// against 1.54 ms for 4096 x 256 in one run, and 2.2 against 1.9 ms in benchmarks/kernels.py,
// 2026-11-23), while rows of 64 and 1024 came out the same and rows of 4096 3-8% faster; rows
// between kRun and kStreamRowMin items are therefore written the ordinary way.
constexpr int64_t kStreamMin = int64_t{1} << 16;  // items a tile writes before it streams them
constexpr int64_t kStreamRowMin = 1024;           // the shortest row past kRun that streams


// [Note: split 8-lane vectors]
// The network's code (bitonic_network.h) is compiled twice: in namespace native for the SIMD
// levels, where a vector of W lanes is one register (W = 8 with AVX-512, 4 with AVX2, 2 in the
// baseline build), and in namespace split for the 8-lane network compiled for AVX2
// (sort_rows_8_lanes_avx2, which runs the AVX-512 variant's logic on CPUs without it). A 64-byte
// GCC vector has no register there: GCC 12 lowers its selects (the minimum and maximum of
// exchange) and permutes one 64-bit lane at a time through memory, and copies it as 8- or
// 16-byte pieces that the 32-byte loads after them cannot take from the store buffer (3637
// vminsd, 3648 vmaxsd and 10398 vmovsd in 29730 instructions). In split, a 64-byte vector is a
// SplitVector: two 32-byte halves, each operation two 4-lane ones (9983 instructions; float32
// rows of 16 to 4096, one tile, 2^20 items, on a 16-core AVX-512 Xeon on 2026-11-25: 1.2-1.3
// times the 4-lane network's time, where it was 9-22 times).

// A 64-byte vector as two 32-byte GCC vectors, with the operators the network uses.
template <typename E>
struct SplitVector {
  typedef E Half __attribute__((vector_size(32)));
  static constexpr int kHalf = 32 / sizeof(E);
  Half half[2];

  // Lane i, to read or assign. (GCC 12 warns that the other lanes of a vector built lane by
  // lane, from {}, may be uninitialized: -Wmaybe-uninitialized is off for the assignment.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
  struct Lane {
    SplitVector& v;
    int i;
    POPSIM_INLINE Lane& operator=(E value) {
      v.half[i / kHalf][i % kHalf] = value;
      return *this;
    }
    POPSIM_INLINE operator E() const { return v.half[i / kHalf][i % kHalf]; }
  };
#pragma GCC diagnostic pop
  POPSIM_INLINE Lane operator[](int i) { return {*this, i}; }
  POPSIM_INLINE E operator[](int i) const { return half[i / kHalf][i % kHalf]; }

  // The same bits as lanes of another type (GCC's vector casts).
  template <typename U>
  POPSIM_INLINE explicit operator SplitVector<U>() const {
    using Other = typename SplitVector<U>::Half;
    return {{(Other)half[0], (Other)half[1]}};
  }

  POPSIM_INLINE SplitVector operator~() const { return {{~half[0], ~half[1]}}; }
  POPSIM_INLINE SplitVector operator-() const { return {{-half[0], -half[1]}}; }

#define POPSIM_SPLIT_OPERATOR(OP)                                                        \
  POPSIM_INLINE friend SplitVector operator OP(const SplitVector& a, const SplitVector& b) { \
    return {{a.half[0] OP b.half[0], a.half[1] OP b.half[1]}};                            \
  }                                                                                       \
  POPSIM_INLINE friend SplitVector operator OP(const SplitVector& a, E b) {              \
    return {{a.half[0] OP b, a.half[1] OP b}};                                            \
  }                                                                                       \
  POPSIM_INLINE friend SplitVector operator OP(E a, const SplitVector& b) {              \
    return {{a OP b.half[0], a OP b.half[1]}};                                            \
  }                                                                                       \
  POPSIM_INLINE SplitVector& operator OP##=(const SplitVector& b) {                      \
    return *this = *this OP b;                                                            \
  }                                                                                       \
  POPSIM_INLINE SplitVector& operator OP##=(E b) { return *this = *this OP b; }
  POPSIM_SPLIT_OPERATOR(&)
  POPSIM_SPLIT_OPERATOR(|)
  POPSIM_SPLIT_OPERATOR(^)
  POPSIM_SPLIT_OPERATOR(+)
  POPSIM_SPLIT_OPERATOR(-)
  POPSIM_SPLIT_OPERATOR(<<)
  POPSIM_SPLIT_OPERATOR(>>)
#undef POPSIM_SPLIT_OPERATOR
};

namespace native {
constexpr bool kSplit = false;
#include "sort/bitonic_network.h"
}  // namespace native

namespace split {
constexpr bool kSplit = true;
// The vector types of bitonic_network.h: SplitVector where they are 64 bytes.
template <typename Vector, typename E>
using Split = std::conditional_t<sizeof(Vector) == 64, SplitVector<E>, Vector>;
template <int W>
using V = Split<bitonic::V<W>, int64_t>;
template <int W>
using UV = Split<bitonic::UV<W>, uint64_t>;
template <int W>
using V32 = Split<bitonic::V32<W>, int32_t>;
template <int W>
using U32 = Split<bitonic::U32<W>, uint32_t>;
#include "sort/bitonic_network.h"
}  // namespace split

// The functions above compiled for each SIMD level (see [Note: SIMD variants] in simd.h).
#define POPSIM_BITONIC_VARIANT(SUFFIX, ATTRIBUTE, NETWORK, LANES)                             \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE void sort_rows##SUFFIX(                                                           \
      const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,           \
      scalar_t* values, int64_t* indices, int64_t* buf) {                                     \
    NETWORK::sort_rows<Codec, scalar_t, LANES>(in, row_lo, row_hi, n, flip, values, indices,  \
                                               buf);                                          \
  }
POPSIM_BITONIC_VARIANT(_avx512, POPSIM_AVX512, native, 8)
POPSIM_BITONIC_VARIANT(_avx2, POPSIM_AVX2, native, 4)
POPSIM_BITONIC_VARIANT(_base, , native, 2)
// The 8-lane network compiled for AVX2 (see [Note: split 8-lane vectors]), so that the AVX-512
// variant's logic runs in the tests on CPUs without AVX-512 (sort_rows_8_lanes in sort.cpp).
POPSIM_BITONIC_VARIANT(_8_lanes_avx2, POPSIM_AVX2, split, 8)
#undef POPSIM_BITONIC_VARIANT

// Sorts packed items[0, n), given in index order, ascending in place with the current level's
// network; n is at most kBitonicBaseMax. Defined in bitonic.cpp.
void sort_small(uint64_t* items, int64_t n);

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
