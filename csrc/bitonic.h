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

#include "simd.h"

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
struct VecDouble {
  typedef double type __attribute__((vector_size(8 * W)));
};

#define POPSIM_INLINE inline __attribute__((always_inline))

template <int W>
POPSIM_INLINE void load(V<W>& v, const int64_t* p) {
  std::memcpy(&v, p, sizeof(v));
}

template <int W>
POPSIM_INLINE void store(int64_t* p, const V<W>& v) {
  std::memcpy(p, &v, sizeof(v));
}

// Compares a and b lane by lane: a keeps the smaller items, b the larger (see [Note: items as
// doubles]; registers).
template <int W>
POPSIM_INLINE void exchange(V<W>& a, V<W>& b) {
  using D = typename VecDouble<W>::type;
  const D x = (D)a;  // (GCC's vector casts keep the bits)
  const D y = (D)b;
  a = (V<W>)(x < y ? x : y);  // the minpd pattern
  b = (V<W>)(y < x ? x : y);  // and maxpd's
}

// Stores v at p (aligned to its size) with streaming stores (see [Note: streaming stores]), 32
// bytes at a time with AVX (W >= 4): the 8-lane network then also compiles for AVX2
// (sort_rows_8_lanes_avx2), and a 64-byte line takes two stores instead of one.
// (Assembly: GCC has no generic non-temporal store, and the intrinsics need the SIMD target on
// this template itself.)
template <int W, typename Vector>
POPSIM_INLINE void store_streaming(void* p, const Vector& v) {
  if constexpr (W >= 4) {
    typedef long long Half __attribute__((vector_size(32)));
    for (size_t offset = 0; offset < sizeof(v); offset += sizeof(Half)) {
      Half half;
      std::memcpy(&half, reinterpret_cast<const char*>(&v) + offset, sizeof(half));
      Half& out = *reinterpret_cast<Half*>(static_cast<char*>(p) + offset);
      asm("vmovntdq %1, %0" : "=m"(out) : "x"(half));
    }
  } else {
    typedef long long Lanes __attribute__((vector_size(16)));
    Lanes lanes;
    std::memcpy(&lanes, &v, sizeof(lanes));
    asm("movntdq %1, %0" : "=m"(*static_cast<Lanes*>(p)) : "x"(lanes));
  }
}

// Writes an output vector at p: streamed (p aligned to its size) or stored.
template <int W, typename Vector>
POPSIM_INLINE void write_vector(void* p, const Vector& v, bool stream) {
  if (stream) {
    store_streaming<W>(p, v);
  } else {
    std::memcpy(p, &v, sizeof(v));
  }
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
  V<W> low = v;
  V<W> high = __builtin_shuffle(v, partner_lane);
  exchange<W>(low, high);
  v = upper ? high : low;
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
  exchange<W>(x, y);
  store<W>(a, x);
  store<W>(b, y);
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
  exchange<W>(x, y);
  store<W>(a, x);
  store<W>(b, __builtin_shuffle(y, reverse));
}

// The half-cleaner steps over the N vectors v[0, N) in registers: distances N / 2, N / 4, ...,
// 1 vectors.
template <int W, int N>
POPSIM_INLINE void half_cleaners(V<W>* v) {
#pragma GCC unroll 8
  for (int d = N / 2; d >= 1; d /= 2) {
#pragma GCC unroll 8
    for (int m = 0; m < N; ++m) {
      if ((m & d) == 0) {
        exchange<W>(v[m], v[m + d]);
      }
    }
  }
}

// log2(N) half-cleaner steps in one pass: the N vectors at x + m * 2j / N (m < N) are compared
// at distance j, j / 2, ..., 2j / N (N = 4: two steps, N = 8: three).
template <int W, int N>
POPSIM_INLINE void exchange_steps(int64_t* x, int64_t j) {
  const int64_t stride = 2 * j / N;
  V<W> v[N];
#pragma GCC unroll 8
  for (int m = 0; m < N; ++m) {
    load<W>(v[m], x + m * stride);
  }
  half_cleaners<W, N>(v);
#pragma GCC unroll 8
  for (int m = 0; m < N; ++m) {
    store<W>(x + m * stride, v[m]);
  }
}

// Compares vector a with vector b reversed: a keeps the smaller items, b the larger, in
// ascending lane order again (registers).
template <int W>
POPSIM_INLINE void exchange_reversed(V<W>& a, V<W>& b) {
  V<W> reverse;
  for (int i = 0; i < W; ++i) {
    reverse[i] = W - 1 - i;
  }
  V<W> y = __builtin_shuffle(b, reverse);
  exchange<W>(a, y);
  b = __builtin_shuffle(y, reverse);
}

// The mirror step of merge stage k and its first log2(N) half-cleaners (distances k / 4, ...,
// k / 2N) in one pass, on the N vectors of block x at o + m * k / 2N (m < N, o < k / 2N) and
// their mirrors (N = 2: two steps, N = 4: three).
template <int W, int N>
POPSIM_INLINE void mirror_steps(int64_t* x, int64_t k, int64_t o) {
  const int64_t e = k / (2 * N);
  int64_t* at[2 * N];  // ascending positions: the first half's N, then their mirrors
#pragma GCC unroll 4
  for (int m = 0; m < N; ++m) {
    at[m] = x + o + m * e;
    at[2 * N - 1 - m] = x + k - W - o - m * e;
  }
  V<W> v[2 * N];
#pragma GCC unroll 8
  for (int m = 0; m < 2 * N; ++m) {
    load<W>(v[m], at[m]);
  }
#pragma GCC unroll 4
  for (int m = 0; m < N; ++m) {
    exchange_reversed<W>(v[m], v[2 * N - 1 - m]);
  }
  half_cleaners<W, N>(v);
  half_cleaners<W, N>(v + N);
#pragma GCC unroll 8
  for (int m = 0; m < 2 * N; ++m) {
    store<W>(at[m], v[m]);
  }
}

// The half-cleaners of distance below W lanes (W = 4 or 2) on two vectors a and b at once: their
// lanes are regrouped so that each step compares whole vectors, then regrouped back.
template <int W>
POPSIM_INLINE void lane_cleaners_pair(V<W>& a, V<W>& b) {
  if constexpr (W == 4) {
    // distance 2: a0 a1 b0 b1 against a2 a3 b2 b3
    V<4> low = __builtin_shuffle(a, b, V<4>{0, 1, 4, 5});
    V<4> high = __builtin_shuffle(a, b, V<4>{2, 3, 6, 7});
    exchange<4>(low, high);
    // distance 1: a0 a2 b0 b2 against a1 a3 b1 b3
    V<4> even = __builtin_shuffle(low, high, V<4>{0, 4, 2, 6});
    V<4> odd = __builtin_shuffle(low, high, V<4>{1, 5, 3, 7});
    exchange<4>(even, odd);
    const V<4> a_half = __builtin_shuffle(even, odd, V<4>{0, 4, 2, 6});  // a0 a1 b0 b1
    const V<4> b_half = __builtin_shuffle(even, odd, V<4>{1, 5, 3, 7});  // a2 a3 b2 b3
    a = __builtin_shuffle(a_half, b_half, V<4>{0, 1, 4, 5});
    b = __builtin_shuffle(a_half, b_half, V<4>{2, 3, 6, 7});
  } else {
    static_assert(W == 2, "lane_cleaners_pair: 2 or 4 lanes");
    V<2> low = __builtin_shuffle(a, b, V<2>{0, 2});   // a0 b0
    V<2> high = __builtin_shuffle(a, b, V<2>{1, 3});  // a1 b1
    exchange<2>(low, high);
    a = __builtin_shuffle(low, high, V<2>{0, 2});
    b = __builtin_shuffle(low, high, V<2>{1, 3});
  }
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
  if constexpr (W <= 4 && N % 2 == 0) {
#pragma GCC unroll 16
    for (int i = 0; i < N; i += 2) {
      lane_cleaners_pair<W>(v[i], v[i + 1]);
    }
  } else {
#pragma GCC unroll 32
    for (int i = 0; i < N; ++i) {
      lane_steps<W>(v[i], K);
    }
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

template <int W, int P, size_t... I>
POPSIM_INLINE void apply_network(V<W>* v, std::index_sequence<I...>) {
  constexpr auto pairs = odd_even_pairs<P>();
  (exchange<W>(v[pairs[I].first], v[pairs[I].second]), ...);
}

// Swaps the off-diagonal B x B blocks of the 2B x 2B block in lanes and vectors a, b.
template <int W, int B>
POPSIM_INLINE void swap_blocks(V<W>& a, V<W>& b) {
  V<W> low;
  V<W> high;
  for (int l = 0; l < W; ++l) {
    low[l] = (l & B) ? W + l - B : l;
    high[l] = (l & B) ? W + l : l + B;
  }
  const V<W> x = __builtin_shuffle(a, b, low);
  b = __builtin_shuffle(a, b, high);
  a = x;
}

// Transposes the W x W block v[0, W) (lane j of vector i <-> lane i of vector j).
template <int W, int B = W / 2>
POPSIM_INLINE void transpose(V<W>* v) {
  if constexpr (B >= 1) {
#pragma GCC unroll 8
    for (int i = 0; i < W; ++i) {
      if ((i & B) == 0) {
        swap_blocks<W, B>(v[i], v[i + B]);
      }
    }
    transpose<W, B / 2>(v);
  }
}

// Sorts W runs of P items held in registers, one run per lane: vector c + r of v holds items
// c, ..., c + W - 1 of run r (c a multiple of W), before and after.
template <int W, int P>
POPSIM_INLINE void sort_columns_in_registers(V<W>* v) {
  static_assert(P % W == 0, "a run holds whole W x W blocks");
#pragma GCC unroll 16
  for (int c = 0; c < P; c += W) {
    transpose<W>(v + c);  // vector c + i: item c + i of every run
  }
  apply_network<W, P>(v, std::make_index_sequence<odd_even_size<P>()>());
#pragma GCC unroll 16
  for (int c = 0; c < P; c += W) {
    transpose<W>(v + c);
  }
}

// Sorts the W runs of P items at x (run r at x + r * P) ascending, one run per lane.
template <int W, int P>
POPSIM_INLINE void sort_columns(int64_t* x) {
  V<W> v[P];
#pragma GCC unroll 16
  for (int c = 0; c < P; c += W) {
#pragma GCC unroll 8
    for (int r = 0; r < W; ++r) {
      load<W>(v[c + r], x + r * P + c);
    }
  }
  sort_columns_in_registers<W, P>(v);
#pragma GCC unroll 16
  for (int c = 0; c < P; c += W) {
#pragma GCC unroll 8
    for (int r = 0; r < W; ++r) {
      store<W>(x + r * P + c, v[c + r]);
    }
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
  if (size >= W * kRun) {  // runs by columns, then their merges up to kBlock in registers
    for (int64_t o = 0; o < size; o += W * kRun) {
      sort_columns<W, kRun>(x + o);
    }
    if constexpr (kBlock > kRun) {
      for (int64_t o = 0; o < size; o += kBlock) {
        V<W> v[kN];
#pragma GCC unroll 32
        for (int i = 0; i < kN; ++i) {
          load<W>(v[i], x + o + i * W);
        }
        sort_registers_from<W, kN, 2 * kRun>(v);
#pragma GCC unroll 32
        for (int i = 0; i < kN; ++i) {
          store<W>(x + o + i * W, v[i]);
        }
      }
    }
  } else {
    for (int64_t o = 0; o < size; o += kBlock) {
      sort_block<W, kN>(x + o);
    }
  }
  for (int64_t k = 2 * kBlock; k <= size; k *= 2) {
    int64_t j = k / 4;
    if (j >= 2 * kBlock) {  // the mirror step and distances k / 4, k / 8 in one pass
      for (int64_t block = 0; block < size; block += k) {
        for (int64_t o = 0; o < k / 8; o += W) {
          mirror_steps<W, 4>(x + block, k, o);
        }
      }
      j /= 4;
    } else if (j >= kBlock) {  // the mirror step and distance k / 4
      for (int64_t block = 0; block < size; block += k) {
        for (int64_t o = 0; o < k / 4; o += W) {
          mirror_steps<W, 2>(x + block, k, o);
        }
      }
      j /= 2;
    } else {
      for (int64_t block = 0; block < size; block += k) {
        for (int64_t o = 0; o < k / 2; o += W) {
          exchange_mirrored<W>(x + block + o, x + block + k - W - o);
        }
      }
    }
    for (; j >= 4 * kBlock; j /= 8) {  // three steps per pass: distances j, j / 2, j / 4
      for (int64_t block = 0; block < size; block += 2 * j) {
        for (int64_t o = 0; o < j / 4; o += W) {
          exchange_steps<W, 8>(x + block + o, j);
        }
      }
    }
    for (; j >= 2 * kBlock; j /= 4) {  // two steps per pass: distances j and j / 2
      for (int64_t block = 0; block < size; block += 2 * j) {
        for (int64_t o = 0; o < j / 2; o += W) {
          exchange_steps<W, 4>(x + block + o, j);
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

// Sorts packed items[0, n) ascending (n <= kBitonicBaseMax) through buf (room for
// padded_size(n, W) items). The items come in index order, as every caller builds them, so an
// item's position orders equal keys as its index does: the network sees positions as indices
// (indices of any width come through; see [Note: items as doubles]) and the sorted positions
// pick the given items.
template <int W>
POPSIM_INLINE void sort_items(uint64_t* items, int64_t n, int64_t* buf) {
  const int64_t size = padded_size(n, W);
  uint64_t given[kBitonicBaseMax];
  std::copy(items, items + n, given);
  for (int64_t i = 0; i < n; ++i) {
    buf[i] = network_item((items[i] & ~uint64_t{0xffffffff}) | static_cast<uint64_t>(i));
  }
  std::fill(buf + n, buf + size, kPad);
  sort_network<W>(buf, size);
  for (int64_t i = 0; i < n; ++i) {
    items[i] = given[buf[i] & kIndexMask];
  }
}

// Items a sort_rows buffer must hold for rows of n (any SIMD level).
constexpr int64_t rows_buffer_size(int64_t n) { return std::max<int64_t>(padded_size(n, 8), 8 * kRun); }

// Codecs whose items the loops below make and read back W at a time: float32 and int32.
template <typename scalar_t>
constexpr bool kVectorCodec = std::is_same<scalar_t, float>::value ||
                              std::is_same<scalar_t, int32_t>::value;

// The keys of 2W float32 or int32 values (see [Note: sort keys]) with the top bit flipped (they
// order as signed integers); ORs -1 into the lanes of `inexact` whose key does not give the value
// back (NaN, -0.0).
template <typename scalar_t, int W>
POPSIM_INLINE void signed_keys(const scalar_t* in, const V32<2 * W>& flip_mask, V32<2 * W>& keys,
                               V32<2 * W>& inexact) {
  V32<2 * W> bits;
  std::memcpy(&bits, in, sizeof(bits));
  if constexpr (std::is_same<scalar_t, float>::value) {
    const V32<2 * W> nan = (bits & 0x7fffffff) > 0x7f800000;
    const V32<2 * W> negative_zero = bits == INT32_MIN;
    inexact |= nan | negative_zero;
    bits = (bits ^ ((bits >> 31) & 0x7fffffff)) & ~negative_zero;
    bits = nan ? V32<2 * W>{} + 0x7fffffff : bits;
  }
  keys = bits ^ flip_mask;
}

// Whether any lane of mask is set.
template <int W>
POPSIM_INLINE uint32_t any_lane(const V32<2 * W>& mask) {
  uint64_t words[W];
  std::memcpy(words, &mask, sizeof(words));
  uint64_t any = 0;
  for (int l = 0; l < W; ++l) {
    any |= words[l];
  }
  return static_cast<uint32_t>(any != 0);
}

// The network items of the 2W values at in, whose indices are `index` (see [Note: items as
// doubles]), as two vectors of W: first and second hold them interleaved as the unpack
// instructions leave them. Keys that do not give their value back are flagged in `inexact`.
template <typename scalar_t, int W>
POPSIM_INLINE void make_item_vectors(const scalar_t* in, const V32<2 * W>& flip_mask,
                                     const V32<2 * W>& index, V32<2 * W>& inexact,
                                     V<W>& first, V<W>& second) {
  constexpr int kLanes = 2 * W;
  V32<kLanes> low;   // lane pattern of the unpack-low instruction, per 128 bits
  V32<kLanes> high;  // and of unpack-high
  for (int l = 0; l < kLanes; ++l) {
    const int group = l / 4 * 4;
    const int pick = l % 4 / 2;
    low[l] = group + pick + (l % 2 ? kLanes : 0);
    high[l] = group + 2 + pick + (l % 2 ? kLanes : 0);
  }
  V32<kLanes> signed_key;
  signed_keys<scalar_t, W>(in, flip_mask, signed_key, inexact);
  const U32<kLanes> key = (U32<kLanes>)signed_key ^ 0x80000000u;
  // the low and the high words of kExponent | key << 20 | index
  const U32<kLanes> low_words = key << kIndexBits | (U32<kLanes>)index;
  const U32<kLanes> high_words = key >> (32 - kIndexBits) | uint32_t{kExponent >> 32};
  first = (V<W>)__builtin_shuffle(low_words, high_words, low);
  second = (V<W>)__builtin_shuffle(low_words, high_words, high);
}

// The values (as bits) of 2W network items of a float32 or int32 row, from their keys.
template <typename scalar_t, int W>
POPSIM_INLINE void values_of(const V<W>& first, const V<W>& second, const V32<2 * W>& flip_mask,
                             V32<2 * W>& key) {
  constexpr int kLanes = 2 * W;
  V32<kLanes> low_words;
  for (int l = 0; l < kLanes; ++l) {
    low_words[l] = 2 * l;
  }
  // the key in the low word of each item shifted right, the exponent in the high one
  const auto keys_first = (V32<kLanes>)((typename Vec<W>::unsigned_type)first >> kIndexBits);
  const auto keys_second = (V32<kLanes>)((typename Vec<W>::unsigned_type)second >> kIndexBits);
  key = __builtin_shuffle(keys_first, keys_second, low_words);
  key ^= flip_mask ^ INT32_MIN;  // the signed key, as signed_keys made it
  if constexpr (std::is_same<scalar_t, float>::value) {
    key ^= (key >> 31) & 0x7fffffff;
  }
}

// Writes the network items of row_in[0, n) to out (see [Note: items as doubles]), in an order of
// their own (each run of 2W values comes out interleaved as the unpack instructions leave it; the
// sort does not mind). Keys that do not give their value back are flagged in the lanes of
// `inexact` (see signed_keys) or, past the last whole run of 2W, in flags.
template <typename Codec, typename scalar_t, int W>
POPSIM_INLINE void make_items(
    const scalar_t* row_in, int64_t n, uint32_t flip, int64_t* out, uint32_t& flags,
    V32<2 * W>& inexact) {
  int64_t i = 0;
  if constexpr (kVectorCodec<scalar_t>) {
    constexpr int kLanes = 2 * W;
    const V32<kLanes> flip_mask = V32<kLanes>{} - static_cast<int32_t>(flip != 0);
    V32<kLanes> index;
    for (int l = 0; l < kLanes; ++l) {
      index[l] = l;
    }
    for (; i + kLanes <= n; i += kLanes) {
      V<W> first;
      V<W> second;
      make_item_vectors<scalar_t, W>(row_in + i, flip_mask, index, inexact, first, second);
      store<W>(out + i, first);
      store<W>(out + i + W, second);
      index += kLanes;
    }
  }
  for (; i < n; ++i) {
    out[i] = network_item(Codec::make(row_in[i], i, flip, flags));
  }
}

// Writes the sorted network items[0, n) of row_in out as indices and (unless null) values;
// gather: some key did not give its value back (NaN or -0.0), so values are read from row_in.
// stream: write with streaming stores (outputs aligned to 8W bytes, n a multiple of 2W).
template <typename Codec, typename scalar_t, int W>
POPSIM_INLINE void write_items(
    const int64_t* items, int64_t n, const scalar_t* row_in, uint32_t flip, bool gather,
    scalar_t* values, int64_t* indices, bool stream) {
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V<W> item;
    load<W>(item, items + i);
    write_vector<W>(indices + i, item & kIndexMask, stream);
  }
  for (; i < n; ++i) {
    indices[i] = items[i] & kIndexMask;
  }
  if (values == nullptr) {
    return;
  }
  if (gather) {
    for (i = 0; i < n; ++i) {
      values[i] = row_in[indices[i]];
    }
    return;
  }
  i = 0;
  if constexpr (kVectorCodec<scalar_t>) {
    constexpr int kLanes = 2 * W;
    const V32<kLanes> flip_mask = V32<kLanes>{} - static_cast<int32_t>(flip != 0);
    for (; i + kLanes <= n; i += kLanes) {
      V<W> first;
      V<W> second;
      load<W>(first, items + i);
      load<W>(second, items + i + W);
      V32<kLanes> key;
      values_of<scalar_t, W>(first, second, flip_mask, key);
      write_vector<W>(values + i, key, stream);
    }
  }
  for (; i < n; ++i) {
    values[i] = Codec::value(packed_item(items[i]), flip);
  }
}

// W float32 or int32 rows of exactly kRun items from `row` on, held in registers from their
// values to their outputs (the column network of sort_short_rows without its buffer).
template <typename Codec, typename scalar_t, int W>
POPSIM_INLINE void sort_run_rows(const scalar_t* in, int64_t row, uint32_t flip,
                                 scalar_t* values, int64_t* indices, bool stream) {
  constexpr int P = kRun;
  constexpr int kLanes = 2 * W;
  static_assert(P % kLanes == 0, "a run holds whole runs of 2W values");
  const V32<kLanes> flip_mask = V32<kLanes>{} - static_cast<int32_t>(flip != 0);
  V32<kLanes> inexact{};
  V<W> v[P];  // vector j * W + r: the j-th W items of row r
#pragma GCC unroll 4
  for (int c = 0; c < P / kLanes; ++c) {
    V32<kLanes> index;
    for (int l = 0; l < kLanes; ++l) {
      index[l] = c * kLanes + l;
    }
#pragma GCC unroll 8
    for (int r = 0; r < W; ++r) {
      make_item_vectors<scalar_t, W>(in + (row + r) * P + c * kLanes, flip_mask, index, inexact,
                                     v[2 * c * W + r], v[(2 * c + 1) * W + r]);
    }
  }
  sort_columns_in_registers<W, P>(v);  // now row r's sorted items j * W, ..., j * W + W - 1
#pragma GCC unroll 8
  for (int r = 0; r < W; ++r) {
    int64_t* row_indices = indices + (row + r) * P;
#pragma GCC unroll 8
    for (int j = 0; j < P / W; ++j) {
      write_vector<W>(row_indices + j * W, v[j * W + r] & kIndexMask, stream);
    }
  }
  if (values == nullptr) {
    return;
  }
  const bool gather = any_lane<W>(inexact);  // NaN or -0.0: read the values from the input
#pragma GCC unroll 8
  for (int r = 0; r < W; ++r) {
    scalar_t* row_values = values + (row + r) * P;
    if (gather) {
      for (int j = 0; j < P / W; ++j) {
        for (int l = 0; l < W; ++l) {
          row_values[j * W + l] = in[(row + r) * P + (v[j * W + r][l] & kIndexMask)];
        }
      }
      continue;
    }
#pragma GCC unroll 8
    for (int j = 0; j < P / W; j += 2) {
      V32<kLanes> bits;
      values_of<scalar_t, W>(v[j * W + r], v[(j + 1) * W + r], flip_mask, bits);
      write_vector<W>(row_values + j * W, bits, stream);
    }
  }
}

// Rows of n <= P items (P a power of two, W <= P <= kRun), W rows at a time by columns
// (see [Note: column networks]); buf has room for W * P items.
template <typename Codec, typename scalar_t, int W, int P>
POPSIM_INLINE void sort_short_rows(
    const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,
    scalar_t* values, int64_t* indices, int64_t* buf, bool stream) {
  int64_t row = row_lo;
  if constexpr (kVectorCodec<scalar_t> && P == kRun) {
    if (n == P) {
      for (; row + W <= row_hi; row += W) {
        sort_run_rows<Codec, scalar_t, W>(in, row, flip, values, indices, stream);
      }
    }
  }
  for (; row < row_hi; row += W) {
    const int64_t count = std::min<int64_t>(W, row_hi - row);
    uint32_t flags = 0;
    V32<2 * W> inexact{};
    for (int64_t r = 0; r < count; ++r) {
      make_items<Codec, scalar_t, W>(in + (row + r) * n, n, flip, buf + r * P, flags, inexact);
      std::fill(buf + r * P + n, buf + (r + 1) * P, kPad);
    }
    flags |= any_lane<W>(inexact);
    std::fill(buf + count * P, buf + W * P, kPad);
    sort_columns<W, P>(buf);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t at = (row + r) * n;
      write_items<Codec, scalar_t, W>(buf + r * P, n, in + at, flip, flags != 0,
                                      values ? values + at : nullptr, indices + at, stream);
    }
  }
}

// Rows longer than kRun, one at a time through the whole network.
template <typename Codec, typename scalar_t, int W>
POPSIM_INLINE void sort_long_rows(
    const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,
    scalar_t* values, int64_t* indices, int64_t* buf, bool stream) {
  const int64_t size = padded_size(n, W);
  std::fill(buf + n, buf + size, kPad);
  for (int64_t row = row_lo; row < row_hi; ++row) {
    uint32_t flags = 0;
    V32<2 * W> inexact{};
    make_items<Codec, scalar_t, W>(in + row * n, n, flip, buf, flags, inexact);
    flags |= any_lane<W>(inexact);
    sort_network<W>(buf, size);
    write_items<Codec, scalar_t, W>(buf, n, in + row * n, flip, flags != 0,
                                    values ? values + row * n : nullptr, indices + row * n,
                                    stream);
  }
}

// [Note: streaming stores]
// A sort's outputs are written once and not read again by the kernel. Where a tile writes a lot
// of them, they go out with streaming stores, which skip reading each line into the cache before
// writing it: the batched short-row sorts run right after other work (torch.sort, in the
// benchmark) found their 12 MiB of outputs out of cache, and paid for that read as much as for
// the sort of 16-item rows itself. Rows of 256 were slower streamed, though (two threads: 1.97
// against 1.54 ms for 4096 x 256 in one run, and 2.2 against 1.9 ms in benchmarks/kernels.py,
// session 6), while rows of 64 and 1024 came out the same and rows of 4096 3-8% faster; rows
// between kRun and kStreamRowMin items are therefore written the ordinary way.
constexpr int64_t kStreamMin = int64_t{1} << 16;  // items a tile writes before it streams them
constexpr int64_t kStreamRowMin = 1024;           // the shortest row past kRun that streams

// Sorts rows [row_lo, row_hi) of n elements each and writes their values (unless null) and
// indices; buf has room for rows_buffer_size(n) items.
template <typename Codec, typename scalar_t, int W>
POPSIM_INLINE void sort_rows(
    const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,
    scalar_t* values, int64_t* indices, int64_t* buf) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % (8 * W) == 0; };
  const bool stream = kVectorCodec<scalar_t> && (row_hi - row_lo) * n >= kStreamMin &&
                      (n <= kRun || n >= kStreamRowMin) && n % (2 * W) == 0 &&
                      aligned(indices) && (!values || aligned(values));
  // (calls, not function pointers: those would lose the SIMD target)
  if (n <= W) {
    sort_short_rows<Codec, scalar_t, W, W>(in, row_lo, row_hi, n, flip, values, indices, buf,
                                           stream);
  } else if (n <= 2 * W) {
    sort_short_rows<Codec, scalar_t, W, std::min(2 * W, kRun)>(in, row_lo, row_hi, n, flip,
                                                               values, indices, buf, stream);
  } else if (n <= std::min(4 * W, kRun)) {
    sort_short_rows<Codec, scalar_t, W, std::min(4 * W, kRun)>(in, row_lo, row_hi, n, flip,
                                                               values, indices, buf, stream);
  } else if (n <= kRun) {
    sort_short_rows<Codec, scalar_t, W, kRun>(in, row_lo, row_hi, n, flip, values, indices, buf,
                                              stream);
  } else {
    sort_long_rows<Codec, scalar_t, W>(in, row_lo, row_hi, n, flip, values, indices, buf, stream);
  }
  if (stream) {
    __builtin_ia32_sfence();  // streamed stores are weakly ordered: finish them before returning
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
// The 8-lane network compiled for AVX2 (GCC splits each 8-lane operation in two), so that the
// AVX-512 variant's logic runs in the tests on CPUs without AVX-512 (sort_rows_8_lanes in
// sort.cpp).
POPSIM_BITONIC_VARIANT(_8_lanes_avx2, POPSIM_AVX2, 8)
#undef POPSIM_BITONIC_VARIANT

// Sorts packed items[0, n), given in index order, ascending in place with the current level's
// network; n is at most kBitonicBaseMax. Defined in bitonic.cpp.
void sort_small(uint64_t* items, int64_t n);

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
