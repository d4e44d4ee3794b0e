// Memory for large kernel outputs and scratch: 2 MiB blocks kept faulted in between calls.
#pragma once

#include <cstddef>

#include <ATen/ATen.h>

namespace poptorch_sim {

// [Note: output cache]
// Writing memory the process has just been given costs a page fault per 4 KiB page. glibc hands
// big freed blocks back to the kernel (torch.sort's temporaries, or the last call's outputs once
// the heap is trimmed), so a kernel's fresh 12 MiB output for a 2^20 float sort took about 1,000
// faults: 2.5 ms on this project's VMs, more than half of the sort (getrusage's ru_minflt around
// each call). A huge-page hint on the output's aligned interior left the unaligned ends.
//
// So large outputs come from a small cache, as CUDA tensors come from PyTorch's caching allocator:
// blocks are 2 MiB-aligned, rounded up to whole 2 MiB pages with a huge-page hint, and go back to
// the cache when their last tensor dies. The next output of the same rounded size reuses a block
// that is already mapped. The cache keeps at most kOutputCacheBytes of idle blocks (the oldest go
// first), and tensors smaller than kOutputCacheMin take PyTorch's own allocator. Storages stay
// resizable. A forked child (DataLoader workers) bypasses the cache.
constexpr size_t kOutputCacheMin = size_t{1} << 20;
constexpr size_t kOutputCacheBytes = size_t{64} << 20;

// An empty contiguous CPU tensor; from the cache when it is at least kOutputCacheMin bytes.
at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype);

// A fresh 2 MiB-aligned block of `bytes` rounded up to whole 2 MiB pages (the rounded size in
// `*rounded`), with a huge-page hint. Release it with std::free. Throws std::bad_alloc.
void* alloc_huge_block(size_t bytes, size_t* rounded);

}  // namespace poptorch_sim
