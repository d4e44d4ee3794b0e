// SIMD wrappers of the bitonic network: GCC vector types of W lanes, and the 8-lane vector
// as two 4-lane halves.
#pragma once

#include <cstdint>

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

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

// A GCC vector of N lanes of E (16-bit values and their 32-bit widenings, item_vectors.inc).
template <typename E, int N>
struct Lanes {
  typedef E type __attribute__((vector_size(sizeof(E) * N)));
};

#define POPSIM_INLINE inline __attribute__((always_inline))

// [Note: split 8-lane vectors]
// The network's code (sort/bitonic/*.inc) is compiled twice: in namespace native for the SIMD
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

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
