// The bitonic network's code: its vectors, steps and row loops, and the definitions of bitonic.h's
// row sorts for one SIMD level. Included only by the files that compile them (bitonic_*.cpp) and
// by bitonic.cpp.
//
// [Note: one file per variant]
// Each SIMD variant of the row sorts (and the 8-lane network compiled for AVX2) is compiled in its
// own file, bitonic_<variant>.cpp, which defines it (POPSIM_BITONIC_VARIANT) and instantiates it
// for every dtype sort.cpp dispatches (POPSIM_BITONIC_INSTANCES); sort.cpp sees only the
// declarations of bitonic.h. One file holding all of them took the longest of the extension's
// compiles, which a build on many cores waits for alone.
//
// [Note: the network out of line]
// The network's code is always inlined (POPSIM_INLINE), and an always-inlined function is compiled
// again in every caller: inlined into the row loops, the network was compiled once per dtype, nine
// times per variant. Its passes over a buffer of items do not depend on the dtype, so they are
// compiled once per variant instead, as ordinary functions the row loops call (once per row, or
// per W rows): the whole network of a row (sort_row_items_once), the column networks of W short
// rows (sort_columns_once) and the network on 32-bit items (narrow::sort_network_once). The .inc
// files declare them; POPSIM_BITONIC_VARIANT and POPSIM_BITONIC_NARROW_NETWORK define them in the
// variant's file with its SIMD target (explicit specializations, one per lane count, which is
// one variant's). Inside them the network is inlined as before, into the same code. Only the
// register-held rows of kRun values (sort_run_rows) keep the network inlined into each dtype's
// loop. CPU seconds of each file compiled alone with the build's flags, 2-vCPU Intel Xeon
// (AVX-512), GCC 12.2, shared, 2026-11-28, inlined -> out of line: avx512 56.7 -> 19.4, avx2
// 47.4 -> 18.9, base 35.4 -> 13.7, 8_lanes 104.5 -> 28.2.
#pragma once

// The standard headers of the network's code (the .inc files below, included into namespaces).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "common/simd.h"
#include "sort/bitonic.h"
#include "sort/bitonic/items.h"
#include "sort/bitonic/network.h"
#include "sort/bitonic/partition.h"
#include "sort/bitonic/rows.h"
#include "sort/bitonic/vectors.h"
#include "sort/sort.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

// The network's vector code, one file per layer (SIMD wrappers, network steps, item
// vectors, row loops), compiled once per vector kind: see [Note: split 8-lane vectors].
namespace native {
constexpr bool kSplit = false;
constexpr bool kNarrow = false;
using Item = int64_t;
#include "sort/bitonic/vector_ops.inc"
#include "sort/bitonic/steps.inc"
#include "sort/bitonic/pieces.inc"
#include "sort/bitonic/item_vectors.inc"
#include "sort/bitonic/row_loops.inc"
}  // namespace native

namespace split {
constexpr bool kSplit = true;
constexpr bool kNarrow = false;
using Item = int64_t;
// The vector types of the network's code: SplitVector where they are 64 bytes.
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
#include "sort/bitonic/vector_ops.inc"
#include "sort/bitonic/steps.inc"
#include "sort/bitonic/pieces.inc"
#include "sort/bitonic/item_vectors.inc"
#include "sort/bitonic/row_loops.inc"
}  // namespace split

// The network on 32-bit items, for rows of 16-bit keys (see [Note: 16-bit keys] in
// bitonic/narrow_rows.inc) and windowed rows (see [Note: windowed 32-bit items] in
// bitonic/window_rows.inc): a vector of W lanes holds W items (W = 16 with AVX-512, 8 with AVX2).
namespace narrow {
constexpr bool kSplit = false;
constexpr bool kNarrow = true;
using Item = int32_t;
template <int W>
using V = bitonic::V32<W>;
template <int W>
using UV = bitonic::U32<W>;
#include "sort/bitonic/vector_ops.inc"
#include "sort/bitonic/steps.inc"
#include "sort/bitonic/narrow_rows.inc"
#include "sort/bitonic/window_rows.inc"
}  // namespace narrow

// The definitions of bitonic.h's row sorts for one SIMD level: SUFFIX and ATTRIBUTE name it,
// NETWORK is the namespace of its network on 64-bit items and LANES their lanes.
// NARROW_LANES: the lanes of the network on 32-bit items that sorts rows of 16-bit keys longer
// than kRun and the windowed rows (0: none, those rows go through the network on 64-bit items).
#define POPSIM_BITONIC_VARIANT(SUFFIX, ATTRIBUTE, NETWORK, LANES, NARROW_LANES)               \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE void sort_rows##SUFFIX(                                                           \
      const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,           \
      scalar_t* values, int64_t* indices, int64_t* buf) {                                     \
    if constexpr (NARROW_LANES > 0 && narrow::kNarrowKeys<scalar_t>) {                        \
      if (n > kRun) {                                                                         \
        return narrow::sort_narrow_rows<scalar_t, NARROW_LANES>(in, row_lo, row_hi, n, flip,  \
                                                                values, indices, buf);        \
      }                                                                                       \
    }                                                                                         \
    if constexpr (NARROW_LANES > 0 && narrow::kWindowKeys<scalar_t>) {                        \
      if (n > narrow::kWindowRowMin && n <= narrow::kWindowRowMax) {                          \
        return narrow::sort_window_rows<Codec, scalar_t, NARROW_LANES>(                       \
            in, row_lo, row_hi, n, flip, values, indices, buf);                               \
      }                                                                                       \
    }                                                                                         \
    NETWORK::sort_rows<Codec, scalar_t, LANES>(in, row_lo, row_hi, n, flip, values, indices,  \
                                               buf);                                          \
  }                                                                                           \
  template <typename Codec, typename scalar_t>                                                \
  ATTRIBUTE void sort_wide_rows##SUFFIX(                                                      \
      const scalar_t* in, int64_t row_lo, int64_t row_hi, int64_t n, uint32_t flip,           \
      scalar_t* values, int64_t* indices, int64_t* buf) {                                     \
    if constexpr (NARROW_LANES > 0) {                                                         \
      if (n > kRun && n <= narrow::kWindowRowMax) {                                           \
        return narrow::sort_window_rows<Codec, scalar_t, NARROW_LANES>(                       \
            in, row_lo, row_hi, n, flip, values, indices, buf);                               \
      }                                                                                       \
    }                                                                                         \
    NETWORK::sort_wide_rows<Codec, scalar_t, LANES>(in, row_lo, row_hi, n, flip, values,      \
                                                    indices, buf);                            \
  }                                                                                           \
  template <>                                                                                 \
  ATTRIBUTE __attribute__((noinline)) void NETWORK::sort_row_items_once<LANES>(               \
      NETWORK::Item * x, int64_t n, int64_t size, NETWORK::Item * spare) {                    \
    NETWORK::sort_row_items<LANES>(x, n, size, spare);                                        \
  }                                                                                           \
  template <>                                                                                 \
  ATTRIBUTE __attribute__((noinline)) void NETWORK::sort_columns_once<LANES>(                 \
      NETWORK::Item * x, int p) {                                                             \
    NETWORK::sort_columns_of<LANES>(x, p);                                                    \
  }

// The definition of the network on 32-bit items out of line (narrow::sort_network_once) for the
// variants that have one (NARROW_LANES > 0 in POPSIM_BITONIC_VARIANT).
#define POPSIM_BITONIC_NARROW_NETWORK(ATTRIBUTE, NARROW_LANES)                                \
  template <>                                                                                 \
  ATTRIBUTE __attribute__((noinline)) void narrow::sort_network_once<NARROW_LANES>(           \
      narrow::Item * x, int64_t size) {                                                       \
    narrow::sort_network<NARROW_LANES>(x, size);                                              \
  }

// The instantiation of FUNCTION##SUFFIX for dtype T and its key codec.
#define POPSIM_BITONIC_INSTANCE(SUFFIX, FUNCTION, CODEC, T)                                     \
  template void FUNCTION##SUFFIX<CODEC<T>, T>(const T*, int64_t, int64_t, int64_t, uint32_t, T*, \
                                              int64_t*, int64_t*);

// The instantiations of variant SUFFIX for every dtype sort.cpp dispatches (dispatch_sort_type).
#define POPSIM_BITONIC_INSTANCES(SUFFIX)                                \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_rows, Codec32, float)            \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_rows, Codec32, c10::Half)        \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_rows, Codec32, c10::BFloat16)    \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_rows, Codec32, int32_t)          \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_rows, Codec32, int16_t)          \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_rows, Codec32, int8_t)           \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_rows, Codec32, uint8_t)          \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_wide_rows, Codec64, int64_t)     \
  POPSIM_BITONIC_INSTANCE(SUFFIX, sort_wide_rows, Codec64, double)

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
