// The bitonic sorting network: whole short rows, and the in-cache base case of the long-row sorts.
//
// [Note: bitonic network]
// A bitonic sorting network sorts P = 2^p items in p(p+1)/2 steps; each step compares and
// exchanges P/2 fixed pairs of items, with no branch depending on the data, so every step is a
// few vector instructions per W items (W = 8 lanes of 64 bits with AVX-512, 4 with AVX2, 2 in
// the baseline build). It sorts the packed items of [Note: sort keys] (key << 32 | index): they
// are all distinct, so the network's result is the one sorted order, the order a stable sort
// gives, and every SIMD variant yields the same bits. Items are stored with the top bit flipped
// so that they compare as signed 64-bit integers (AVX2 has only the signed compare); rows are
// padded to a power of two (and to at least 2W) with INT64_MAX, which sorts after every item.
//
// Merge stage k (k = 2, 4, ..., P) first compares item i of each block of k with its mirror
// (block + k - 1 - i), then runs half-cleaners of distance k/4, ..., 1. A step of distance at
// least W pairs whole vectors (the mirror step reverses one of them); steps of distance below W
// pair lanes of one vector (a permute, a compare and a blend), and all of them for one stage run
// on a vector while it sits in a register. The first log2(W) stages sort each vector on its own.
//
// The first stages run on blocks of 8 vectors held in registers, and so do
// the last steps of every later stage (all of distance below the block): only the steps of
// longer distance go through memory, one pass over the row each.
//
// Rows of up to kBitonicRowMax items (sort.cpp) are sorted whole by the network, one tile per
// group of rows; groups of the scatter sort and tiles' slices of up to kBitonicBaseMax items
// use it as their base case. Both limits were chosen by measurement (README "Figures").
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

// Longest run the long-row sorts hand to the network as their base case.
constexpr int64_t kBitonicBaseMax = 64;

constexpr uint64_t kBias = uint64_t{1} << 63;  // flips the top bit: unsigned -> signed order
constexpr int64_t kPad = INT64_MAX;            // a padding item: sorts after every real item

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
};
template <int W>
using V = typename Vec<W>::type;

#define POPSIM_INLINE inline __attribute__((always_inline))

template <int W>
POPSIM_INLINE void load(V<W>& v, const int64_t* p) {
  std::memcpy(&v, p, sizeof(v));
}

template <int W>
POPSIM_INLINE void store(int64_t* p, const V<W>& v) {
  std::memcpy(p, &v, sizeof(v));
}

// Compares lane i of v with lane i ^ J (Mirror: i ^ (2J - 1)); the lower lane of each pair
// (bit J clear) keeps the smaller item.
template <int W, int J, bool Mirror>
POPSIM_INLINE void exchange_lanes(V<W>& v) {
  V<W> partner_lane;
  V<W> upper;
  for (int i = 0; i < W; ++i) {
    partner_lane[i] = Mirror ? (i ^ (2 * J - 1)) : (i ^ J);
    upper[i] = (i & J) ? -1 : 0;
  }
  const V<W> partner = __builtin_shuffle(v, partner_lane);
  v = ((v < partner) ^ upper) ? v : partner;
}

// The steps of merge stage k that pair lanes of one vector (see [Note: bitonic network]).
template <int W>
POPSIM_INLINE void lane_steps(V<W>& v, int64_t k) {
  if (k <= W) {
    if (k == 2) {
      exchange_lanes<W, 1, true>(v);
    } else if constexpr (W >= 4) {
      if (k == 4) {
        exchange_lanes<W, 2, true>(v);
      } else if constexpr (W >= 8) {
        exchange_lanes<W, 4, true>(v);
      }
    }
  }
  const int64_t top = k <= W ? k / 4 : W / 2;
  if constexpr (W >= 8) {
    if (top >= 4) {
      exchange_lanes<W, 4, false>(v);
    }
  }
  if constexpr (W >= 4) {
    if (top >= 2) {
      exchange_lanes<W, 2, false>(v);
    }
  }
  if (top >= 1) {
    exchange_lanes<W, 1, false>(v);
  }
}

// Compares the vectors at a and b lane by lane: a keeps the smaller items.
template <int W>
POPSIM_INLINE void exchange_vectors(int64_t* a, int64_t* b) {
  V<W> x;
  V<W> y;
  load<W>(x, a);
  load<W>(y, b);
  const V<W> less = x < y;
  store<W>(a, less ? x : y);
  store<W>(b, less ? y : x);
}

// Compares the vector at a with the vector at b reversed: a keeps the smaller items.
template <int W>
POPSIM_INLINE void exchange_mirrored(int64_t* a, int64_t* b) {
  V<W> reverse;
  for (int i = 0; i < W; ++i) {
    reverse[i] = W - 1 - i;
  }
  V<W> x;
  V<W> y;
  load<W>(x, a);
  load<W>(y, b);
  y = __builtin_shuffle(y, reverse);
  const V<W> less = x < y;
  const V<W> high = less ? y : x;
  store<W>(a, less ? x : y);
  store<W>(b, __builtin_shuffle(high, reverse));
}

// Compares vectors a and b lane by lane: a keeps the smaller items (registers).
template <int W>
POPSIM_INLINE void exchange(V<W>& a, V<W>& b) {
  const V<W> less = a < b;
  const V<W> low = less ? a : b;
  b = less ? b : a;
  a = low;
}

// Two half-cleaner steps in one pass: the vectors at x, x + j/2, x + j and x + 3j/2 are
// compared at distance j, then at distance j / 2.
template <int W>
POPSIM_INLINE void exchange_two_steps(int64_t* x, int64_t j) {
  V<W> a;
  V<W> b;
  V<W> c;
  V<W> d;
  load<W>(a, x);
  load<W>(b, x + j / 2);
  load<W>(c, x + j);
  load<W>(d, x + j + j / 2);
  exchange<W>(a, c);
  exchange<W>(b, d);
  exchange<W>(a, b);
  exchange<W>(c, d);
  store<W>(x, a);
  store<W>(x + j / 2, b);
  store<W>(x + j, c);
  store<W>(x + j + j / 2, d);
}

// Compares vector a with vector b reversed: a keeps the smaller items, b the larger, in
// ascending lane order again (registers).
template <int W>
POPSIM_INLINE void exchange_reversed(V<W>& a, V<W>& b) {
  V<W> reverse;
  for (int i = 0; i < W; ++i) {
    reverse[i] = W - 1 - i;
  }
  const V<W> y = __builtin_shuffle(b, reverse);
  const V<W> less = a < y;
  const V<W> high = less ? y : a;
  a = less ? a : y;
  b = __builtin_shuffle(high, reverse);
}

// Merge stage K over the N vectors v[0, N) held in registers (W < K <= N * W); with Mirror
// false, only its half-cleaners (distance K / 4 and below: the tail of a longer stage).
template <int W, int N, int K, bool Mirror>
POPSIM_INLINE void merge_registers(V<W>* v) {
  constexpr int kVectors = K / W;  // vectors per block of K items
  if constexpr (Mirror) {
#pragma GCC unroll 32
    for (int block = 0; block < N; block += kVectors) {
#pragma GCC unroll 32
      for (int i = 0; i < kVectors / 2; ++i) {
        exchange_reversed<W>(v[block + i], v[block + kVectors - 1 - i]);
      }
    }
  }
#pragma GCC unroll 8
  for (int jv = kVectors / 4; jv >= 1; jv /= 2) {
#pragma GCC unroll 32
    for (int block = 0; block < N; block += 2 * jv) {
#pragma GCC unroll 32
      for (int i = 0; i < jv; ++i) {
        exchange<W>(v[block + i], v[block + i + jv]);
      }
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) {
    lane_steps<W>(v[i], K);
  }
}

// Merge stages K, 2K, ..., N * W over v[0, N) in registers.
template <int W, int N, int K>
POPSIM_INLINE void sort_registers_from(V<W>* v) {
  if constexpr (K <= N * W) {
    merge_registers<W, N, K, true>(v);
    sort_registers_from<W, N, 2 * K>(v);
  }
}

// Sorts the N * W items at x in registers.
template <int W, int N>
POPSIM_INLINE void sort_block(int64_t* x) {
  V<W> v[N];
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) {
    load<W>(v[i], x + i * W);
#pragma GCC unroll 8
    for (int k = 2; k <= W; k *= 2) {
      lane_steps<W>(v[i], k);
    }
  }
  sort_registers_from<W, N, 2 * W>(v);
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) {
    store<W>(x + i * W, v[i]);
  }
}

// The half-cleaners of distance below N * W of a merge stage, on the N * W items at x.
template <int W, int N>
POPSIM_INLINE void clean_block(int64_t* x) {
  V<W> v[N];
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) {
    load<W>(v[i], x + i * W);
  }
  merge_registers<W, N, 2 * N * W, false>(v);
#pragma GCC unroll 32
  for (int i = 0; i < N; ++i) {
    store<W>(x + i * W, v[i]);
  }
}

// Vectors a register block holds: half of AVX2's register file, the rest is for temporaries.
// (16 for AVX-512 spilled three times as many registers to the stack in GCC 12's code.)
constexpr int kBlockVectors = 8;

// Sorts x[0, size) (biased items; size a power of two, at least 2W) ascending in place.
template <int W>
POPSIM_INLINE void sort_network(int64_t* x, int64_t size) {
  constexpr int kN = kBlockVectors;
  constexpr int64_t kBlock = int64_t{kN} * W;
  if (size < kBlock) {
    if (size == 4 * W) {
      return sort_block<W, 4>(x);
    }
    return sort_block<W, 2>(x);
  }
  for (int64_t o = 0; o < size; o += kBlock) {
    sort_block<W, kN>(x + o);
  }
  for (int64_t k = 2 * kBlock; k <= size; k *= 2) {
    for (int64_t block = 0; block < size; block += k) {
      for (int64_t o = 0; o < k / 2; o += W) {
        exchange_mirrored<W>(x + block + o, x + block + k - W - o);
      }
    }
    int64_t j = k / 4;
    for (; j >= 2 * kBlock; j /= 4) {  // two steps per pass: distances j and j / 2
      for (int64_t block = 0; block < size; block += 2 * j) {
        for (int64_t o = 0; o < j / 2; o += W) {
          exchange_two_steps<W>(x + block + o, j);
        }
      }
    }
    if (j >= kBlock) {
      for (int64_t block = 0; block < size; block += 2 * j) {
        for (int64_t o = 0; o < j; o += W) {
          exchange_vectors<W>(x + block + o, x + block + j + o);
        }
      }
    }
    for (int64_t o = 0; o < size; o += kBlock) {
      clean_block<W, kN>(x + o);
    }
  }
}

// Sorts packed items[0, n) ascending through buf (room for padded_size(n, W) items).
template <int W>
POPSIM_INLINE void sort_items(uint64_t* items, int64_t n, int64_t* buf) {
  const int64_t size = padded_size(n, W);
  for (int64_t i = 0; i < n; ++i) {
    buf[i] = static_cast<int64_t>(items[i] ^ kBias);
  }
  std::fill(buf + n, buf + size, kPad);
  sort_network<W>(buf, size);
  for (int64_t i = 0; i < n; ++i) {
    items[i] = static_cast<uint64_t>(buf[i]) ^ kBias;
  }
}

// Sorts rows [row_lo, row_hi) of n elements each and writes their values
// (unless null) and indices; buf has room for padded_size(n, W) items.
template <typename Codec, typename scalar_t, int W>
POPSIM_INLINE void sort_rows(
    const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,
    scalar_t* values, int64_t* indices, int64_t* buf) {
  const int64_t size = padded_size(n, W);
  std::fill(buf + n, buf + size, kPad);
  for (int64_t row = row_lo; row < row_hi; ++row) {
    const scalar_t* row_in = in + row * n;
    uint32_t flags = 0;
    for (int64_t i = 0; i < n; ++i) {
      buf[i] = static_cast<int64_t>(Codec::make(row_in[i], i, flip, flags) ^ kBias);
    }
    sort_network<W>(buf, size);
    int64_t* row_indices = indices + row * n;
    for (int64_t i = 0; i < n; ++i) {
      row_indices[i] = buf[i] & 0xffffffff;
    }
    if (values == nullptr) {
      continue;
    }
    scalar_t* row_values = values + row * n;
    if (flags != 0) {  // NaN or -0.0: the key does not give the value back
      for (int64_t i = 0; i < n; ++i) {
        row_values[i] = row_in[row_indices[i]];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        row_values[i] = Codec::value(static_cast<uint64_t>(buf[i]) ^ kBias, flip);
      }
    }
  }
}

// The functions above compiled for each SIMD level (see [Note: SIMD variants] in simd.h).
#define POPSIM_BITONIC_VARIANT(SUFFIX, ATTRIBUTE, LANES)                                      \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE void sort_rows##SUFFIX(                                                           \
      const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,           \
      scalar_t* values, int64_t* indices, int64_t* buf) {                                     \
    sort_rows<Codec, scalar_t, LANES>(in, row_lo, row_hi, n, flip, values, indices, buf);     \
  }
POPSIM_BITONIC_VARIANT(_avx512, POPSIM_AVX512, 8)
POPSIM_BITONIC_VARIANT(_avx2, POPSIM_AVX2, 4)
POPSIM_BITONIC_VARIANT(_base, , 2)
#undef POPSIM_BITONIC_VARIANT

// Sorts packed items[0, n) ascending in place with the current level's network; n is at most
// kBitonicBaseMax. Defined in bitonic.cpp.
void sort_small(uint64_t* items, int64_t n);

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
