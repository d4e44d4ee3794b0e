// The scatter sort of one long row across tiles: one exchange, then cache-resident radix
// sorts that write the outputs. See [Note: scatter sort] in scatter_sort.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "sort/scatter_sort.h"

namespace poptorch_sim {
namespace sorting {

namespace {

constexpr int kMsdBits = 12;  // the exchange's digit
constexpr uint32_t kMsdMask = (1u << kMsdBits) - 1;
constexpr int64_t kMsdBuckets = int64_t{1} << kMsdBits;
constexpr int kTopShift = 32 - kMsdBits;  // shift of the top digit
constexpr int64_t kChunk = 2048;          // keys made at a time, kept in L1
constexpr int64_t kCacheResident = 32768;  // a group this small is sorted inside L2
// Neighbouring digits share a group only while it stays this small: a group of one digit
// has kMsdBits key bits fewer left to sort (one radix pass fewer).
constexpr int64_t kSmallGroup = 2048;
constexpr int kStreamsPerTile = 4;
constexpr int kLsdBits = 11;   // widest digit of a cache-resident pass

// The work unit of every superstep: a tile's share runs as kStreamsPerTile streams that the
// host threads claim one by one (see [Note: tile pool]), so a descheduled thread holds up
// less of the superstep.
struct Streams {
  int64_t n;
  int64_t count;
  int64_t lo(int64_t s) const { return engine::split_point(n, count, s); }
  int64_t hi(int64_t s) const { return engine::split_point(n, count, s + 1); }
};

// Makes the keys of stream `s` chunk by chunk and hands each chunk to `use(keys, lo, hi)`.
template <typename F>
uint32_t for_each_key_chunk(const Streams& streams, int64_t s, const KeyChunk& keys, const F& use) {
  uint32_t chunk[kChunk];
  uint32_t diff = 0;
  const int64_t end = streams.hi(s);
  for (int64_t lo = streams.lo(s); lo < end; lo += kChunk) {
    const int64_t hi = std::min(end, lo + kChunk);
    diff |= keys(lo, hi, chunk);
    use(chunk, lo, hi);
  }
  return diff;
}

// Groups of neighbouring digits: group_of[digit], and each group's first digit and start.
struct Groups {
  std::vector<uint16_t> group_of = std::vector<uint16_t>(kMsdBuckets);
  std::vector<uint32_t> first_digit;
  std::vector<int64_t> starts;  // groups + 1 entries
  int64_t largest = 0;
  int64_t size() const { return static_cast<int64_t>(first_digit.size()); }
};

Groups form_groups(const std::vector<uint32_t>& counts, int64_t streams) {
  Groups groups;
  int64_t open = 0;
  int64_t offset = 0;
  for (int64_t d = 0; d < kMsdBuckets; ++d) {
    int64_t total = 0;
    for (int64_t s = 0; s < streams; ++s) {
      total += counts[s * kMsdBuckets + d];
    }
    if (groups.first_digit.empty() || (open > 0 && open + total > kSmallGroup)) {
      groups.first_digit.push_back(static_cast<uint32_t>(d));
      groups.starts.push_back(offset);
      open = 0;
    }
    groups.group_of[d] = static_cast<uint16_t>(groups.size() - 1);
    open += total;
    offset += total;
    groups.largest = std::max(groups.largest, open);
  }
  groups.starts.push_back(offset);
  return groups;
}

// Where each stream's items of each group go: stream order within a group keeps it stable.
std::vector<uint32_t> stream_cursors(
    const std::vector<uint32_t>& counts, const Groups& groups, int64_t streams) {
  const int64_t count = groups.size();
  std::vector<uint32_t> cursors(static_cast<size_t>(streams * count), 0u);
  for (int64_t s = 0; s < streams; ++s) {
    for (int64_t d = 0; d < kMsdBuckets; ++d) {
      cursors[s * count + groups.group_of[d]] += counts[s * kMsdBuckets + d];
    }
  }
  for (int64_t g = 0; g < count; ++g) {
    auto offset = static_cast<uint32_t>(groups.starts[g]);
    for (int64_t s = 0; s < streams; ++s) {
      const uint32_t c = cursors[s * count + g];
      cursors[s * count + g] = offset;
      offset += c;
    }
  }
  return cursors;
}

// [Note: two-step scatter]
// A scatter written as one loop, dst[cursor[digit]++] = item, runs at a fraction of the
// speed of its two halves run apart: each store's address comes from a cursor load, and the
// core's memory-dependence predictor, having seen stores and cursor loads collide, makes every
// cursor load wait for the store before it, so the loop runs one load-store latency per item.
// Scattering in blocks, first every item's place (cursor traffic only), then every store,
// keeps the two apart: the exchange, whose stores miss the cache, runs about 2x faster. (The
// cache-resident radix passes run faster as one loop.)
// Each place also asks for the cache line after it, in that group: a group's next line is then
// on its way long before its first store. Without this, when the scatter's destination is not
// in the cache (after torch.sort or any big job), every eighth store per group waits for a line
// from memory. Measured on 2^20 floats, each call right after a torch.sort of the same size, in
// three runs alternating builds with and without it: medians of 11 calls 5.0–6.0 ms without,
// 4.7–4.9 ms with; unchanged when the sort's memory is still cached.
constexpr int64_t kScatterBlock = 256;
constexpr int64_t kLineItems = 64 / sizeof(uint64_t);

// Stable scatter of items[0, count) to dst by digit(item), through `cursor`.
template <typename Make, typename Digit>
inline void two_step_scatter(
    int64_t count, const Make& make, const Digit& digit, uint32_t* cursor, uint64_t* dst) {
  uint32_t place[kScatterBlock];
  for (int64_t lo = 0; lo < count; lo += kScatterBlock) {
    const int64_t block = std::min(kScatterBlock, count - lo);
    for (int64_t j = 0; j < block; ++j) {
      const uint32_t p = cursor[digit(lo + j)]++;
      place[j] = p;
      __builtin_prefetch(dst + p + kLineItems, 1);  // the group's next line, for writing
    }
    for (int64_t j = 0; j < block; ++j) {
      dst[place[j]] = make(lo + j);
    }
  }
}

// Stable scatter of items[0, m) to `to` by the digit (item >> shift) & mask. Four items are
// loaded before any is stored, which lets their cursor updates overlap (measured ~15% faster).
inline void scatter_by_digit(
    const uint64_t* items, int64_t m, int shift, uint32_t mask, uint32_t* cursor, uint64_t* to) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const uint64_t x0 = items[i];
    const uint64_t x1 = items[i + 1];
    const uint64_t x2 = items[i + 2];
    const uint64_t x3 = items[i + 3];
    to[cursor[(x0 >> shift) & mask]++] = x0;
    to[cursor[(x1 >> shift) & mask]++] = x1;
    to[cursor[(x2 >> shift) & mask]++] = x2;
    to[cursor[(x3 >> shift) & mask]++] = x3;
  }
  for (; i < m; ++i) {
    to[cursor[(items[i] >> shift) & mask]++] = items[i];
  }
}

// LSD radix sort of a group's items (in index order) by key bits [0, top], `Passes` digits of
// `width` bits, all counted in one read. Returns the buffer holding the result: `src` when
// every pass found all items sharing a digit, else `a` or `b`.
template <int Passes>
const uint64_t* lsd_sort_group(
    const uint64_t* src, int64_t m, int width, uint64_t* a, uint64_t* b) {
  constexpr int64_t kBuckets = int64_t{1} << kLsdBits;
  uint32_t counts[Passes][kBuckets];
  const uint32_t mask = (1u << width) - 1;
  std::memset(counts, 0, sizeof(counts));
  for (int64_t i = 0; i < m; ++i) {
    const auto key = static_cast<uint32_t>(src[i] >> 32);
    for (int p = 0; p < Passes; ++p) {
      ++counts[p][(key >> (p * width)) & mask];
    }
  }
  const uint64_t* from = src;
  uint64_t* to = a;
  for (int p = 0; p < Passes; ++p) {
    const int shift = 32 + p * width;
    uint32_t* c = counts[p];
    if (c[(from[0] >> shift) & mask] == static_cast<uint32_t>(m)) {
      continue;
    }
    uint32_t offset = 0;
    for (uint32_t d = 0; d <= mask; ++d) {
      const uint32_t count = c[d];
      c[d] = offset;
      offset += count;
    }
    scatter_by_digit(from, m, shift, mask, c, to);
    from = to;
    to = to == a ? b : a;
  }
  return from;
}

// Sorts a group's items (in index order) by key bits [0, top]; returns the result's buffer.
const uint64_t* sort_group(const uint64_t* src, int64_t m, int top, uint64_t* a, uint64_t* b,
                           simd::Level level) {
  if (top < 0 || m <= 1) {
    return src;
  }
  if (m <= bitonic::kBitonicBaseMax) {
    std::memcpy(a, src, static_cast<size_t>(m) * sizeof(uint64_t));
    bitonic::sort_small(a, m, level);
    return a;
  }
  const int passes = top / kLsdBits + 1;
  const int width = (top + passes) / passes;
  switch (passes) {
    case 1:
      return lsd_sort_group<1>(src, m, width, a, b);
    case 2:
      return lsd_sort_group<2>(src, m, width, a, b);
    default:
      return lsd_sort_group<3>(src, m, width, a, b);
  }
}

// Highest key bit that can differ inside group g (-1: none), from its digits and `shift`.
int group_top_bit(const Groups& groups, int64_t g, int shift) {
  const uint32_t first = groups.first_digit[g];
  const uint32_t last =
      g + 1 < groups.size() ? groups.first_digit[g + 1] - 1 : static_cast<uint32_t>(kMsdMask);
  if (first == last) {
    return shift - 1;
  }
  return shift + 31 - __builtin_clz(first ^ last);
}

// Counts every stream's keys by the digit at `shift` (superstep 2 when not fused).
void count_digits(
    const Streams& streams, const KeyChunk& keys, int shift, KernelScope& scope,
    std::vector<uint32_t>& counts) {
  std::fill(counts.begin(), counts.end(), 0u);
  scope.superstep(streams.count, [&](int64_t s) {
    uint32_t* c = counts.data() + s * kMsdBuckets;
    for_each_key_chunk(streams, s, keys, [&](const uint32_t* chunk, int64_t lo, int64_t hi) {
      for (int64_t i = 0; i < hi - lo; ++i) {
        ++c[(chunk[i] >> shift) & kMsdMask];
      }
    });
  }, streams.n);
}

// All keys equal: index order is sorted order.
void emit_in_index_order(
    const Streams& streams, const KeyChunk& keys, const Emit& emit, KernelScope& scope) {
  scope.superstep(streams.count, [&](int64_t s) {
    std::vector<uint64_t> items(kChunk);
    for_each_key_chunk(streams, s, keys, [&](const uint32_t* chunk, int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        items[i - lo] = (static_cast<uint64_t>(chunk[i - lo]) << 32) | static_cast<uint64_t>(i);
      }
      emit(items.data(), hi - lo, lo);
    });
  }, streams.n);
}

// Superstep 1 (with 2 fused): makes every stream's keys and counts them by their top digit.
// Returns the OR of the bits in which keys differ from element 0's.
uint32_t build_and_count(
    const Streams& streams, const KeyChunk& keys, KernelScope& scope,
    std::vector<uint32_t>& counts) {
  std::vector<uint32_t> diffs(static_cast<size_t>(streams.count), 0u);
  scope.superstep(streams.count, [&](int64_t s) {
    uint32_t* c = counts.data() + s * kMsdBuckets;
    diffs[s] = for_each_key_chunk(streams, s, keys, [&](const uint32_t* chunk, int64_t lo,
                                                        int64_t hi) {
      for (int64_t i = 0; i < hi - lo; ++i) {
        ++c[chunk[i] >> kTopShift];
      }
    });
  }, streams.n);
  uint32_t diff = 0;
  for (uint32_t d : diffs) {
    diff |= d;
  }
  return diff;
}

// Superstep 4, the exchange: every stream makes its keys again and scatters its (key, index)
// items to their groups' places.
void exchange(
    const Streams& streams, const KeyChunk& keys, const Groups& groups,
    std::vector<uint32_t> cursors, int shift, uint64_t* items, KernelScope& scope) {
  scope.superstep(streams.count, [&](int64_t s) {
    uint32_t* cursor = cursors.data() + s * groups.size();
    const uint16_t* group_of = groups.group_of.data();
    for_each_key_chunk(streams, s, keys, [&](const uint32_t* chunk, int64_t lo, int64_t hi) {
      two_step_scatter(
          hi - lo,
          [chunk, lo](int64_t j) {
            return (static_cast<uint64_t>(chunk[j]) << 32) | static_cast<uint64_t>(lo + j);
          },
          [chunk, group_of, shift](int64_t j) { return group_of[(chunk[j] >> shift) & kMsdMask]; },
          cursor, items);
    });
  }, streams.n);
  scope.add_bytes_exchanged(streams.n * static_cast<int64_t>(sizeof(uint64_t)));
}

// Superstep 5: every stream sorts the groups that start in its range and writes them out.
void sort_groups(
    const Streams& streams, const Groups& groups, int shift, const uint64_t* items,
    const Emit& emit, KernelScope& scope, simd::Level level) {
  scope.superstep(streams.count, [&](int64_t s) {
    thread_local std::vector<uint64_t> a;
    thread_local std::vector<uint64_t> b;
    const auto first = std::lower_bound(groups.starts.begin(), groups.starts.end() - 1,
                                        streams.lo(s));
    for (auto it = first; it != groups.starts.end() - 1 && *it < streams.hi(s); ++it) {
      const int64_t g = it - groups.starts.begin();
      const int64_t m = *(it + 1) - *it;
      if (static_cast<int64_t>(a.size()) < m) {
        a.resize(static_cast<size_t>(m));
        b.resize(static_cast<size_t>(m));
      }
      const uint64_t* sorted =
          sort_group(items + *it, m, group_top_bit(groups, g, shift), a.data(), b.data(), level);
      emit(sorted, m, *it);
    }
  }, streams.n);
}

}  // namespace

// See [Note: scatter sort] in scatter_sort.h for the steps.
bool scatter_sort_row(
    int64_t n, int64_t tiles, KernelScope& scope, uint64_t* items, const KeyChunk& keys,
    const Emit& emit, simd::Level level) {
  const Streams streams{n, tiles * kStreamsPerTile};
  std::vector<uint32_t> counts(static_cast<size_t>(streams.count * kMsdBuckets), 0u);
  const uint32_t diff = build_and_count(streams, keys, scope, counts);
  if (diff == 0) {
    scope.add_supersteps(1);  // nothing to count
    emit_in_index_order(streams, keys, emit, scope);
    return true;
  }
  const int shift = std::max(0, 32 - __builtin_clz(diff) - kMsdBits);
  if (shift == kTopShift) {
    scope.add_supersteps(1);  // the count ran fused into the build
  } else {
    count_digits(streams, keys, shift, scope, counts);
  }
  const Groups groups = form_groups(counts, streams.count);
  if (groups.largest > std::max<int64_t>(kCacheResident, 2 * n / tiles)) {
    return false;
  }
  exchange(streams, keys, groups, stream_cursors(counts, groups, streams.count), shift, items,
           scope);
  sort_groups(streams, groups, shift, items, emit, scope, level);
  scope.add_supersteps(1);  // the write-out ran fused into the sort
  const double log_chunk = std::max(1.0, std::log2(static_cast<double>(n) / tiles));
  scope.add_compare_exchanges(static_cast<int64_t>(static_cast<double>(n) * log_chunk));
  return true;
}

}  // namespace sorting
}  // namespace poptorch_sim
