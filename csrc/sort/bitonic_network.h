// The vector code of the bitonic network, for one setting of kSplit: included twice by bitonic.h,
// into namespaces native and split (see [Note: split 8-lane vectors] there). No include guard.

// The lanes of a and b picked by a constant mask (lane m < lanes of a, else lane m - lanes of b),
// as __builtin_shuffle(a, b, mask), into out (a vector of the same size; it may be a or b).
// SplitVector (see [Note: split 8-lane vectors]): each output half is one permute of the (at most
// two) input halves its lanes come from; the mask is a constant, so the choice folds away.
template <typename Out, typename Vector, typename Mask>
POPSIM_INLINE void permute(Out& out, const Vector& a, const Vector& b, const Mask& mask) {
  if constexpr (kSplit && sizeof(Vector) == 64) {
    using Half = typename Vector::Half;
    using HalfMask = typename Mask::Half;
    constexpr int kHalf = Vector::kHalf;
    const Half in[4] = {a.half[0], a.half[1], b.half[0], b.half[1]};
    Vector result;
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      int first = -1;  // the input halves (0, 1: a's, 2, 3: b's) this output half reads
      int second = -1;
      bool two = true;  // at most two of them
#pragma GCC unroll 16
      for (int l = 0; l < kHalf; ++l) {
        const int from = static_cast<int>(mask[h * kHalf + l]) / kHalf;
        if (first < 0 || from == first) {
          first = from;
        } else if (second < 0 || from == second) {
          second = from;
        } else {
          two = false;
        }
      }
      second = second < 0 ? first : second;
      HalfMask pick;
#pragma GCC unroll 16
      for (int l = 0; l < kHalf; ++l) {
        const int m = static_cast<int>(mask[h * kHalf + l]);
        pick[l] = m % kHalf + (m / kHalf == first ? 0 : kHalf);
      }
      if (two) {
        result.half[h] = __builtin_shuffle(in[first], in[second], pick);
      } else {  // lanes of three or four halves: a permute of a's, one of b's, and a blend
        HalfMask from_a;
        HalfMask from_b;
#pragma GCC unroll 16
        for (int l = 0; l < kHalf; ++l) {
          const int m = static_cast<int>(mask[h * kHalf + l]);
          from_a[l] = m < 2 * kHalf ? m : 0;
          from_b[l] = m < 2 * kHalf ? 0 : m - 2 * kHalf;
          pick[l] = m < 2 * kHalf ? l : kHalf + l;
        }
        result.half[h] = __builtin_shuffle(__builtin_shuffle(in[0], in[1], from_a),
                                           __builtin_shuffle(in[2], in[3], from_b), pick);
      }
    }
    out = (Out)result;
  } else {
    out = (Out)__builtin_shuffle(a, b, mask);
  }
}

// Copies a vector from or to memory (a SplitVector half by half: as one 64-byte block GCC 12
// copies it 8 bytes at a time).
template <typename Vector>
POPSIM_INLINE void read_vector(Vector& v, const void* p) {
  if constexpr (kSplit && sizeof(Vector) == 64) {
    std::memcpy(&v.half[0], p, sizeof(v.half[0]));
    std::memcpy(&v.half[1], static_cast<const char*>(p) + sizeof(v.half[0]), sizeof(v.half[1]));
  } else {
    std::memcpy(&v, p, sizeof(v));
  }
}

template <typename Vector>
POPSIM_INLINE void store_vector(void* p, const Vector& v) {
  if constexpr (kSplit && sizeof(Vector) == 64) {
    std::memcpy(p, &v.half[0], sizeof(v.half[0]));
    std::memcpy(static_cast<char*>(p) + sizeof(v.half[0]), &v.half[1], sizeof(v.half[1]));
  } else {
    std::memcpy(p, &v, sizeof(v));
  }
}

template <int W>
POPSIM_INLINE void load(V<W>& v, const int64_t* p) {
  read_vector(v, p);
}

template <int W>
POPSIM_INLINE void store(int64_t* p, const V<W>& v) {
  store_vector(p, v);
}

// Compares a and b lane by lane: a keeps the smaller items, b the larger (see [Note: items as
// doubles]; registers).
template <int W>
POPSIM_INLINE void exchange(V<W>& a, V<W>& b) {
  if constexpr (kSplit && W == 8) {
    exchange<W / 2>(a.half[0], b.half[0]);
    exchange<W / 2>(a.half[1], b.half[1]);
  } else {
    using D = typename VecDouble<W>::type;
    const D x = (D)a;  // (GCC's vector casts keep the bits)
    const D y = (D)b;
    a = (V<W>)(x < y ? x : y);  // the minpd pattern
    b = (V<W>)(y < x ? x : y);  // and maxpd's
  }
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
    store_vector(p, v);
  }
}

// Compares lane i of v with lane i ^ J (Mirror: i ^ (2J - 1)); the lower lane of each pair
// (bit J clear) keeps the smaller item.
template <int W, int J, bool Mirror>
POPSIM_INLINE void exchange_lanes(V<W>& v) {
  V<W> partner_lane{};
  V<W> keep{};  // lane i of the smaller items (bit J of i clear) or of the larger (W + i)
  for (int i = 0; i < W; ++i) {
    partner_lane[i] = Mirror ? (i ^ (2 * J - 1)) : (i ^ J);
    keep[i] = (i & J) ? W + i : i;
  }
  V<W> low = v;
  V<W> high{};
  permute(high, v, v, partner_lane);
  exchange<W>(low, high);
  // (a blend written as a permute: GCC 12 turns a select by a constant mask vector (upper ?
  // high : low) of 8 lanes into lane-by-lane inserts, 20 instructions instead of one)
  permute(v, low, high, keep);
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
  V<W> reverse{};
  for (int i = 0; i < W; ++i) {
    reverse[i] = W - 1 - i;
  }
  V<W> x;
  V<W> y;
  load<W>(x, a);
  load<W>(y, b);
  permute(y, y, y, reverse);
  exchange<W>(x, y);
  permute(y, y, y, reverse);
  store<W>(a, x);
  store<W>(b, y);
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
  V<W> reverse{};
  for (int i = 0; i < W; ++i) {
    reverse[i] = W - 1 - i;
  }
  V<W> y;
  permute(y, b, b, reverse);
  exchange<W>(a, y);
  permute(b, y, y, reverse);
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

template <int W, int P, size_t... I>
POPSIM_INLINE void apply_network(V<W>* v, std::index_sequence<I...>) {
  constexpr auto pairs = odd_even_pairs<P>();
  (exchange<W>(v[pairs[I].first], v[pairs[I].second]), ...);
}

// Swaps the off-diagonal B x B blocks of the 2B x 2B block in lanes and vectors a, b.
template <int W, int B>
POPSIM_INLINE void swap_blocks(V<W>& a, V<W>& b) {
  V<W> low{};
  V<W> high{};
  for (int l = 0; l < W; ++l) {
    low[l] = (l & B) ? W + l - B : l;
    high[l] = (l & B) ? W + l : l + B;
  }
  V<W> x;
  V<W> y;
  permute(x, a, b, low);
  permute(y, a, b, high);
  a = x;
  b = y;
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

// The keys of 2W float32 or int32 values (see [Note: sort keys]) with the top bit flipped (they
// order as signed integers); ORs -1 into the lanes of `inexact` whose key does not give the value
// back (NaN, -0.0).
template <typename scalar_t, int W>
POPSIM_INLINE void signed_keys(const scalar_t* in, const V32<2 * W>& flip_mask, V32<2 * W>& keys,
                               V32<2 * W>& inexact) {
  V32<2 * W> bits;
  read_vector(bits, in);
  if constexpr (std::is_same<scalar_t, float>::value) {
    // All ones where the value is NaN, where it is -0.0. For 16 lanes by shifts and subtractions:
    // GCC 12 compiles a comparison of 16 lanes for AVX-512 one lane at a time when its result is
    // a vector rather than a mask register.
    V32<2 * W> nan;
    V32<2 * W> negative_zero;
    if constexpr (sizeof(bits) == 64) {
      nan = (0x7f800000 - (bits & 0x7fffffff)) >> 31;
      const V32<2 * W> zero_if_negative_zero = bits ^ INT32_MIN;
      negative_zero = ~((zero_if_negative_zero | -zero_if_negative_zero) >> 31);
    } else {
      nan = (bits & 0x7fffffff) > 0x7f800000;
      negative_zero = bits == INT32_MIN;
    }
    inexact |= nan | negative_zero;
    bits = (bits ^ ((bits >> 31) & 0x7fffffff)) & ~negative_zero;
    if constexpr (sizeof(bits) == 64) {
      bits = (bits & ~nan) | (nan & 0x7fffffff);
    } else {
      bits = nan ? V32<2 * W>{} + 0x7fffffff : bits;
    }
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
  V32<kLanes> low{};   // lane pattern of the unpack-low instruction, per 128 bits
  V32<kLanes> high{};  // and of unpack-high
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
  permute(first, low_words, high_words, (U32<kLanes>)low);
  permute(second, low_words, high_words, (U32<kLanes>)high);
}

// The values (as bits) of 2W network items of a float32 or int32 row, from their keys.
template <typename scalar_t, int W>
POPSIM_INLINE void values_of(const V<W>& first, const V<W>& second, const V32<2 * W>& flip_mask,
                             V32<2 * W>& key) {
  constexpr int kLanes = 2 * W;
  V32<kLanes> low_words{};
  for (int l = 0; l < kLanes; ++l) {
    low_words[l] = 2 * l;
  }
  // the key in the low word of each item shifted right, the exponent in the high one
  const auto keys_first = (V32<kLanes>)((UV<W>)first >> kIndexBits);
  const auto keys_second = (V32<kLanes>)((UV<W>)second >> kIndexBits);
  permute(key, keys_first, keys_second, low_words);
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
    V32<kLanes> index{};
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
    V32<kLanes> index{};
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

