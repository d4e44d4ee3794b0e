// Radix sorts of packed (key << 32 | index) items: per tile, and one row across tiles.
// See [Note: sort keys] in sort.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "sort.h"

namespace poptorch_sim {
namespace sorting {

namespace {

constexpr int64_t kInsertionSortMax = 48;
constexpr int64_t kCacheResident = 32768;  // items sorted digit by digit inside L2
// Neighbouring digits of the scatter sort share a group only while it stays this small: a
// group of one digit has kMsdBits fewer key bits left to sort (one radix pass fewer).
constexpr int64_t kSmallGroup = 2048;

inline uint32_t high_word(uint64_t item) { return static_cast<uint32_t>(item >> 32); }

void insertion_sort(uint64_t* items, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    const uint64_t item = items[i];
    int64_t j = i;
    for (; j > 0 && items[j - 1] > item; --j) {
      items[j] = items[j - 1];
    }
    items[j] = item;
  }
}

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

constexpr int kLineItems = 8;  // items per 64-byte cache line

// Stable scatter of src[lo, hi) to dst at cursor[group_of[digit]], staging each group's items
// in a cache line of its own and writing whole lines out.
void write_combined_scatter(
    const uint64_t* src, uint64_t* dst, int64_t lo, int64_t hi, int shift, const uint16_t* map,
    uint32_t* cursor, int64_t groups) {
  constexpr uint32_t kMask = (1u << kMsdBits) - 1;
  thread_local std::vector<uint64_t> lines;
  thread_local std::vector<uint8_t> fill;
  lines.resize(static_cast<size_t>(groups * kLineItems));
  fill.assign(static_cast<size_t>(groups), 0);
  uint64_t* line = lines.data();
  uint8_t* count = fill.data();
  for (int64_t i = lo; i < hi; ++i) {
    const uint64_t item = src[i];
    const uint32_t g = map[(item >> shift) & kMask];
    const uint32_t k = count[g];
    line[g * kLineItems + k] = item;
    if (k == kLineItems - 1) {
      std::memcpy(dst + cursor[g], line + g * kLineItems, sizeof(uint64_t) * kLineItems);
      cursor[g] += kLineItems;
      count[g] = 0;
    } else {
      count[g] = static_cast<uint8_t>(k + 1);
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    std::memcpy(dst + cursor[g], line + g * kLineItems, sizeof(uint64_t) * count[g]);
    cursor[g] += count[g];
  }
}

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
void radix_sort_high_words(uint64_t* items, uint64_t* scratch, int64_t n) {
  if (n <= kInsertionSortMax) {
    insertion_sort(items, n);
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
    radix_sort_high_words(scratch + lo, items + lo, size);
    std::memcpy(items + lo, scratch + lo, static_cast<size_t>(size) * sizeof(uint64_t));
  }
}

// [Note: scatter sort]
// One row spread over T tiles in five supersteps, one of them a real exchange:
//   1 build   each tile packs the items of its slice, noting which key bits differ
//   2 count   each tile counts its items by the 12-bit digit below the highest differing bit
//   3 (sync)  digit counts are summed; every digit is a group of its own (only runs of small
//             neighbouring digits share one), so a group has 12 key bits fewer left to sort;
//             every tile learns where its items of each group go (tile order keeps it stable)
//   4 scatter each tile sends its items to their groups' places (the exchange), through
//             cache-line write-combining buffers
//   5 sort    groups are dealt out to tiles by position; each tile radix-sorts its groups
// (the write-out of values and indices is one more superstep). A group that is one huge digit
// (keys bunched below the digit) would leave one tile with most of the work; then the row
// goes back to per-tile sorts and merges.
uint64_t* scatter_sort_row(
    int64_t n, int64_t tiles, KernelScope& scope, uint64_t* items, uint64_t* scratch,
    const std::function<uint32_t(int64_t, int64_t)>& build) {
  constexpr uint32_t kMask = (1u << kMsdBits) - 1;
  constexpr int64_t kBuckets = int64_t{1} << kMsdBits;
  // Each tile's share of a superstep runs as kStreams work units (its streams), which the
  // host threads claim one by one, so a descheduled thread holds up less of the superstep.
  // Superstep 2 (count) runs inside superstep 1 on the host: each stream's items are counted
  // by their top 12 key bits chunk by chunk while they are still in cache. The digit is only
  // right when the top key bit differs (mixed signs); otherwise superstep 2 runs on its own.
  const int64_t streams = tiles * kStreams;
  constexpr int kTopShift = 64 - kMsdBits;
  constexpr int64_t kChunk = 4096;
  std::vector<uint32_t> counts(static_cast<size_t>(streams * kBuckets), 0u);
  std::vector<uint32_t> diffs(static_cast<size_t>(streams), 0u);
  scope.superstep(streams, [&](int64_t s) {
    {
      uint32_t* c = counts.data() + s * kBuckets;
      const int64_t end = split_point(n, streams, s + 1);
      for (int64_t lo = split_point(n, streams, s); lo < end; lo += kChunk) {
        const int64_t hi = std::min(end, lo + kChunk);
        diffs[s] |= build(lo, hi);
        for (int64_t i = lo; i < hi; ++i) {
          ++c[items[i] >> kTopShift];
        }
      }
    }
  }, n);
  uint32_t diff = 0;
  for (uint32_t d : diffs) {
    diff |= d;
  }
  if (diff == 0) {
    return items;  // all keys equal: built in index order, already sorted
  }
  const int shift = 32 + std::max(0, 32 - __builtin_clz(diff) - kMsdBits);
  if (shift == kTopShift) {
    scope.add_supersteps(1);  // the fused count
  } else {
    std::fill(counts.begin(), counts.end(), 0u);
    scope.superstep(streams, [&](int64_t s) {
      {
        uint32_t* c = counts.data() + s * kBuckets;
        for (int64_t i = split_point(n, streams, s); i < split_point(n, streams, s + 1); ++i) {
          ++c[(items[i] >> shift) & kMask];
        }
      }
    }, n);
  }
  std::vector<uint16_t> group_of(kBuckets);
  std::vector<int64_t> group_sizes;
  int64_t open = 0;
  for (int64_t d = 0; d < kBuckets; ++d) {
    int64_t total = 0;
    for (int64_t s = 0; s < streams; ++s) {
      total += counts[s * kBuckets + d];
    }
    if (group_sizes.empty() || (open > 0 && open + total > kSmallGroup)) {
      group_sizes.push_back(0);
      open = 0;
    }
    group_of[d] = static_cast<uint16_t>(group_sizes.size() - 1);
    group_sizes.back() += total;
    open += total;
  }
  const int64_t largest = *std::max_element(group_sizes.begin(), group_sizes.end());
  if (largest > std::max<int64_t>(kCacheResident, 2 * n / tiles)) {
    return nullptr;
  }
  const auto groups = static_cast<int64_t>(group_sizes.size());
  std::vector<uint32_t> cursors(static_cast<size_t>(streams * groups), 0u);
  for (int64_t s = 0; s < streams; ++s) {
    for (int64_t d = 0; d < kBuckets; ++d) {
      cursors[s * groups + group_of[d]] += counts[s * kBuckets + d];
    }
  }
  std::vector<int64_t> group_starts(static_cast<size_t>(groups + 1), 0);
  uint32_t offset = 0;
  for (int64_t g = 0; g < groups; ++g) {
    group_starts[g] = offset;
    for (int64_t s = 0; s < streams; ++s) {
      const uint32_t count = cursors[s * groups + g];
      cursors[s * groups + g] = offset;
      offset += count;
    }
  }
  group_starts[groups] = n;
  scope.superstep(streams, [&](int64_t s) {
    // Items gather in a cache line per group (write combining) before they go out, so the
    // scatter writes whole lines instead of touching one line per item.
    const uint16_t* map = group_of.data();
    {
      write_combined_scatter(
          items, scratch, split_point(n, streams, s), split_point(n, streams, s + 1), shift,
          map, cursors.data() + s * groups, groups);
    }
  }, n);
  scope.add_bytes_exchanged(n * static_cast<int64_t>(sizeof(uint64_t)));
  scope.superstep(streams, [&](int64_t s) {
    const int64_t lo = split_point(n, streams, s);
    const int64_t hi = split_point(n, streams, s + 1);
    const auto begin = std::lower_bound(group_starts.begin(), group_starts.end() - 1, lo);
    for (auto it = begin; it != group_starts.end() - 1 && *it < hi; ++it) {
      const int64_t size = *(it + 1) - *it;
      radix_sort_high_words(scratch + *it, items + *it, size);
    }
  }, n);
  const double log_chunk = std::max(1.0, std::log2(static_cast<double>(n) / tiles));
  scope.add_compare_exchanges(static_cast<int64_t>(static_cast<double>(n) * log_chunk));
  return scratch;
}

}  // namespace sorting
}  // namespace poptorch_sim
