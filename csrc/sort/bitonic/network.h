// The network's fixed shape: the column networks' comparators and the register block.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

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
// (16 for AVX-512's 64-bit items spilled three times as many registers to the stack in GCC 12's
// code; its 32-bit items take 16, see sort_network.)
constexpr int kBlockVectors = 8;

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
