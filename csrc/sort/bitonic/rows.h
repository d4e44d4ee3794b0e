// Row loops' sizes: the buffer a row sort needs, and when its outputs are streamed.
#pragma once

#include <algorithm>
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
// the sort of 16-item rows itself. Rows of 256 were slower streamed, though (two threads: 1.97
// against 1.54 ms for 4096 x 256 in one run, and 2.2 against 1.9 ms in benchmarks/kernels.py,
// 2026-11-23), while rows of 64 and 1024 came out the same and rows of 4096 3-8% faster; rows
// between kRun and kStreamRowMin items are therefore written the ordinary way.
constexpr int64_t kStreamMin = int64_t{1} << 16;  // items a tile writes before it streams them
constexpr int64_t kStreamRowMin = 1024;           // the shortest row past kRun that streams

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
