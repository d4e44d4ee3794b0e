// Item encoding of the bitonic network: packed items as network items (doubles) and back.
#pragma once

#include <cstdint>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

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

// Codecs whose items the row loops (row_loops.inc) make and read back 2W at a time: float32,
// int32 and the 16-bit dtypes (float16, bfloat16, int16), whose 2W values are widened to 32-bit
// lanes (see read_lanes in item_vectors.inc).
template <typename scalar_t>
constexpr bool kVectorCodec = std::is_same<scalar_t, float>::value ||
                              std::is_same<scalar_t, int32_t>::value ||
                              std::is_same<scalar_t, int16_t>::value ||
                              std::is_same<scalar_t, c10::Half>::value ||
                              std::is_same<scalar_t, c10::BFloat16>::value;

// Floating-point dtypes among them, whose keys map NaN and -0.0 (see [Note: sort keys]).
template <typename scalar_t>
constexpr bool kFloatLanes = std::is_same<scalar_t, float>::value ||
                             std::is_same<scalar_t, c10::Half>::value ||
                             std::is_same<scalar_t, c10::BFloat16>::value;

// 64-bit dtypes, which the network sorts by a 32-bit window of their keys (see [Note: wide keys]
// in row_loops.inc).
template <typename scalar_t>
constexpr bool kWideKeys = std::is_same<scalar_t, double>::value ||
                           std::is_same<scalar_t, int64_t>::value;

// The least right shift that fits keys spanning `span` (largest less smallest) in a window of
// window_bits bits (see [Note: wide keys] and [Note: windowed 32-bit items]).
inline int window_shift(uint64_t span, int window_bits) {
  const int bits = span == 0 ? 0 : 64 - __builtin_clzll(span);
  return bits > window_bits ? bits - window_bits : 0;
}

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
