// Radix sorts of packed (key << 32 | index) items inside one tile.
// See [Note: sort keys] in sort.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "sort/sort.h"

namespace poptorch_sim {
namespace sorting {

namespace {

constexpr int64_t kCacheResident = 32768;  // items sorted digit by digit inside L2

inline uint32_t high_word(uint64_t item) { return static_cast<uint32_t>(item >> 32); }

// Bits in which the high words of the items differ (0: all keys equal).
uint32_t differing_bits(const uint64_t* items, int64_t n) {
  const uint32_t first = high_word(items[0]);
  uint32_t diff = 0;
  for (int64_t i = 1; i < n; ++i) {
    diff |= high_word(items[i]) ^ first;
  }
  return diff;
}

constexpr int kStreams = 4;
constexpr int kLsdBits = 11;  // widest digit of a cache-resident pass

// Stable scatter of src[0, n) into dst by the digit (item >> shift) & mask. The input is cut
// into kStreams quarters, each with its own histogram and write cursors, so consecutive
// items of one bucket do not serialise on one counter. Fills `starts` (mask + 2 entries) with
// the bucket boundaries; returns false (and copies nothing) when every item shares a digit.
bool stable_scatter(
    const uint64_t* src, uint64_t* dst, int64_t n, int shift, uint32_t mask,
    std::vector<uint32_t>& cursors, std::vector<uint32_t>& starts) {
  const size_t buckets = static_cast<size_t>(mask) + 1;
  cursors.assign(buckets * kStreams, 0u);
  int64_t bounds[kStreams + 1];
  for (int q = 0; q <= kStreams; ++q) {
    bounds[q] = n / kStreams * q + std::min<int64_t>(q, n % kStreams);
  }
  const int64_t shortest = bounds[1] - bounds[0] - (n % kStreams != 0 ? 1 : 0);
  uint32_t* c = cursors.data();
  for (int64_t i = 0; i < shortest; ++i) {
    for (int q = 0; q < kStreams; ++q) {
      ++c[q * buckets + ((src[bounds[q] + i] >> shift) & mask)];
    }
  }
  for (int q = 0; q < kStreams; ++q) {
    for (int64_t i = bounds[q] + shortest; i < bounds[q + 1]; ++i) {
      ++c[q * buckets + ((src[i] >> shift) & mask)];
    }
  }
  const uint32_t first = (src[0] >> shift) & mask;
  uint32_t total_first = 0;
  for (int q = 0; q < kStreams; ++q) {
    total_first += c[q * buckets + first];
  }
  if (total_first == static_cast<uint32_t>(n)) {
    return false;
  }
  starts.assign(buckets + 1, 0u);
  uint32_t offset = 0;
  for (size_t b = 0; b < buckets; ++b) {
    starts[b] = offset;
    for (int q = 0; q < kStreams; ++q) {
      const uint32_t count = c[q * buckets + b];
      c[q * buckets + b] = offset;
      offset += count;
    }
  }
  starts[buckets] = offset;
  for (int64_t i = 0; i < shortest; ++i) {
    for (int q = 0; q < kStreams; ++q) {
      const uint64_t item = src[bounds[q] + i];
      dst[c[q * buckets + ((item >> shift) & mask)]++] = item;
    }
  }
  for (int q = 0; q < kStreams; ++q) {
    for (int64_t i = bounds[q] + shortest; i < bounds[q + 1]; ++i) {
      dst[c[q * buckets + ((src[i] >> shift) & mask)]++] = src[i];
    }
  }
  return true;
}

constexpr int kMsdBits = 12;  // digit of a most-significant-digit pass

// One most-significant-digit pass: items are counted by the 12-bit digit at `shift`, runs of
// neighbouring digits are grouped so that each group fits in cache (a digit bigger than that
// stays alone), and items are scattered stably by group. Fills `group_starts` (groups + 1).
void grouped_scatter(
    const uint64_t* src, uint64_t* dst, int64_t n, int shift, std::vector<uint32_t>& group_starts) {
  constexpr uint32_t kMask = (1u << kMsdBits) - 1;
  constexpr size_t kBuckets = size_t{1} << kMsdBits;
  std::vector<uint32_t> counts(kBuckets * kStreams, 0u);
  int64_t bounds[kStreams + 1];
  for (int q = 0; q <= kStreams; ++q) {
    bounds[q] = n / kStreams * q + std::min<int64_t>(q, n % kStreams);
  }
  for (int q = 0; q < kStreams; ++q) {
    uint32_t* c = counts.data() + q * kBuckets;
    for (int64_t i = bounds[q]; i < bounds[q + 1]; ++i) {
      ++c[(src[i] >> shift) & kMask];
    }
  }
  std::vector<uint16_t> group_of(kBuckets);
  std::vector<uint32_t> group_sizes;
  uint32_t open = 0;
  for (size_t d = 0; d < kBuckets; ++d) {
    uint32_t total = 0;
    for (int q = 0; q < kStreams; ++q) {
      total += counts[q * kBuckets + d];
    }
    if (group_sizes.empty() || (open > 0 && open + total > kCacheResident)) {
      group_sizes.push_back(0);
      open = 0;
    }
    group_of[d] = static_cast<uint16_t>(group_sizes.size() - 1);
    group_sizes.back() += total;
    open += total;
  }
  const size_t groups = group_sizes.size();
  std::vector<uint32_t> cursors(groups * kStreams, 0u);
  for (int q = 0; q < kStreams; ++q) {
    for (size_t d = 0; d < kBuckets; ++d) {
      cursors[q * groups + group_of[d]] += counts[q * kBuckets + d];
    }
  }
  group_starts.assign(groups + 1, 0u);
  uint32_t offset = 0;
  for (size_t g = 0; g < groups; ++g) {
    group_starts[g] = offset;
    for (int q = 0; q < kStreams; ++q) {
      const uint32_t count = cursors[q * groups + g];
      cursors[q * groups + g] = offset;
      offset += count;
    }
  }
  group_starts[groups] = offset;
  const int64_t shortest = n / kStreams;
  uint32_t* cur = cursors.data();
  const uint16_t* map = group_of.data();
  for (int64_t i = 0; i < shortest; ++i) {
    for (int q = 0; q < kStreams; ++q) {
      const uint64_t item = src[bounds[q] + i];
      dst[cur[q * groups + map[(item >> shift) & kMask]]++] = item;
    }
  }
  for (int q = 0; q < kStreams; ++q) {
    for (int64_t i = bounds[q] + shortest; i < bounds[q + 1]; ++i) {
      dst[cur[q * groups + map[(src[i] >> shift) & kMask]]++] = src[i];
    }
  }
}

// LSD radix sort over the bits [0, top] of the high words in as few digits of at most
// kLsdBits bits as cover them, of equal width; result in `items`.
void lsd_sort(uint64_t* items, uint64_t* scratch, int64_t n, int top) {
  const int passes = (top + kLsdBits) / kLsdBits;
  const int kBits = (top + passes) / passes;
  thread_local std::vector<uint32_t> cursors;
  thread_local std::vector<uint32_t> starts;
  uint64_t* src = items;
  uint64_t* dst = scratch;
  for (int low = 0; low <= top; low += kBits) {
    const uint32_t mask = (1u << std::min(kBits, top + 1 - low)) - 1;
    if (stable_scatter(src, dst, n, 32 + low, mask, cursors, starts)) {
      std::swap(src, dst);
    }
  }
  if (src != items) {
    std::memcpy(items, src, static_cast<size_t>(n) * sizeof(uint64_t));
  }
}

}  // namespace

// [Note: sort keys] items arrive ordered by index, so sorting by high word alone (stably)
// sorts them completely. Large inputs take one most-significant-digit scatter per level until
// the buckets fit in cache, where least-significant-digit passes finish them.
void radix_sort_high_words(uint64_t* items, uint64_t* scratch, int64_t n, simd::Level level) {
  if (n <= bitonic::kBitonicBaseMax) {
    bitonic::sort_small(items, n, level);
    return;
  }
  const uint32_t diff = differing_bits(items, n);
  if (diff == 0) {
    return;
  }
  const int top = 31 - __builtin_clz(diff);
  const int passes = (top + kLsdBits) / kLsdBits;
  if (n <= kCacheResident || (passes <= 2 && n <= 4 * kCacheResident)) {
    lsd_sort(items, scratch, n, top);
    return;
  }
  const int shift = std::max(0, top + 1 - kMsdBits);
  std::vector<uint32_t> group_starts;
  grouped_scatter(items, scratch, n, 32 + shift, group_starts);
  for (size_t g = 0; g + 1 < group_starts.size(); ++g) {
    const int64_t lo = group_starts[g];
    const int64_t size = static_cast<int64_t>(group_starts[g + 1]) - lo;
    radix_sort_high_words(scratch + lo, items + lo, size, level);
    std::memcpy(items + lo, scratch + lo, static_cast<size_t>(size) * sizeof(uint64_t));
  }
}

}  // namespace sorting
}  // namespace poptorch_sim
