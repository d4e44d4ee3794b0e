// Row loops' sizes: the buffer a row sort needs, and when its outputs are streamed.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "sort/bitonic/items.h"
#include "sort/bitonic/network.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

// Rows cut by quicksort partitions into pieces the network sorts (see [Note: partitioned rows]
// in bitonic/pieces.inc): with vectors of at least 4 lanes those of at least kPartitionMin items,
// and at every level those longer than kPartitionFrom whose padding to a power of two is at least
// a fifth of their padded size (size: padded_size(n, W)). A piece is at most kPieceFull items, or
// at most kPieceMax items that fill more than four fifths of their padded size.
constexpr int64_t kPartitionMin = 8192;
constexpr int64_t kPartitionFrom = 512;
constexpr int64_t kPieceFull = 256;
constexpr int64_t kPieceMax = 1024;
constexpr bool partitioned(int64_t n, int64_t size, int lanes) {
  return (lanes >= 4 && n >= kPartitionMin) || (n > kPartitionFrom && 5 * n <= 4 * size);
}
constexpr bool whole_piece(int64_t m) {
  return m <= kPieceFull || (m <= kPieceMax && 5 * m > 4 * padded_size(m, 2));
}

// Items a sort_rows buffer must hold for rows of n (any SIMD level): the padded row, and room for
// the partitions' copies of a row cut into pieces.
constexpr int64_t rows_buffer_size(int64_t n) {
  return std::max<int64_t>(padded_size(n, 8), 8 * kRun) + (n > kPartitionFrom ? n : 0);
}

// [Note: streaming stores]
// A sort's outputs are written once and not read again by the kernel. Where a tile writes a lot
// of them, they go out with streaming stores, which skip reading each line into the cache before
// writing it: the batched short-row sorts run right after other work (torch.sort, in the
// benchmark) found their 12 MiB of outputs out of cache, and paid for that read as much as for
// the sort of 16-item rows itself. Rows of 16 and of 1024 or more stream. For the rows between,
// which way is faster depends on the machine: streamed, rows of 256 took 1.97 against 1.54 ms on
// two threads of an AMD EPYC (2026-11-23), with the outputs in cache, but on an Intel Xeon
// (dev-xeon, 2026-11-26) the short-row benchmark, whose outputs are out of cache, ran float32
// rows of 256 13.3-14.3x torch.sort streamed against 9.8-12.6x (benchmarks/RESULTS.md). So
// poptorch_sim.kernels.simd_choice times both on this machine, with the outputs out of cache,
// and sets the choice (set_stream_mid_rows); until then they are written the ordinary way.
constexpr int64_t kStreamMin = int64_t{1} << 16;  // items a tile writes before it streams them
constexpr int64_t kStreamRowMin = 1024;           // the shortest row past kRun that always streams

// Whether rows of kRun < n < kStreamRowMin items stream too (see [Note: streaming stores]).
extern std::atomic<bool> stream_mid_rows_setting;
inline bool stream_mid_rows() { return stream_mid_rows_setting.load(std::memory_order_relaxed); }

// Whether a tile's outputs of rows of n items (rows * n of them) are streamed, their alignment
// and the vector width aside.
inline bool streamed_rows(int64_t rows, int64_t n) {
  return rows * n >= kStreamMin && (n <= kRun || n >= kStreamRowMin || stream_mid_rows());
}

// Sets whether rows of kRun < n < kStreamRowMin stream; returns the previous setting.
bool set_stream_mid_rows(bool stream);

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
