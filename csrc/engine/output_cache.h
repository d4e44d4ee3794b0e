// Memory for large kernel outputs and scratch: 2 MiB blocks kept faulted in between calls.
#pragma once

#include <cstddef>

#include <ATen/core/Tensor.h>

namespace poptorch_sim {

// [Note: output cache]
// Writing memory the process has just been given costs a page fault per 4 KiB page. glibc hands
// big freed blocks back to the kernel (torch.sort's temporaries, or the last call's outputs once
// the heap is trimmed), so a kernel's fresh 12 MiB output for a 2^20 float sort took about 1,000
// faults: 2.5 ms on this project's VMs, more than half of the sort (getrusage's ru_minflt around
// each call). A huge-page hint on the output's aligned interior left the unaligned ends.
//
// So large outputs come from a small cache, as CUDA tensors come from PyTorch's caching
// allocator: blocks go back to the cache when their last tensor dies, and the next output of the
// same rounded size reuses one that is already mapped. Blocks of at least kHugeBlockMin are
// 2 MiB-aligned and rounded up to whole 2 MiB pages with a huge-page hint (scatters into them miss
// the TLB less; at most 20% of the block is padding); smaller ones are rounded to 4 KiB pages.
// The cache keeps at most kOutputCacheBytes of idle blocks (the oldest go first), and tensors
// smaller than kOutputCacheMin take PyTorch's own allocator. Storages stay resizable. A forked
// child (DataLoader workers) bypasses the cache.
constexpr size_t kOutputCacheMin = size_t{1} << 20;
constexpr size_t kOutputCacheBytes = size_t{64} << 20;
constexpr size_t kHugeBlockMin = size_t{8} << 20;

// An empty contiguous CPU tensor; from the cache when it is at least kOutputCacheMin bytes.
at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype);

// The size of the block that holds `bytes` (see above).
size_t block_size(size_t bytes);

// A fresh page-aligned block of block_size(bytes) bytes, 2 MiB-aligned with a huge-page hint from
// kHugeBlockMin up. Release it with std::free. Throws std::bad_alloc.
void* alloc_block(size_t bytes);

}  // namespace poptorch_sim
