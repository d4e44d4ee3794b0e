// The engine family's ops defined outside library.cpp: the OutputMode.Sum stream and the worker
// threads' memory pool. library.cpp registers them, with the engine's own ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace poptorch_sim {

namespace streams {

// streams.cpp: per replica, the sum of every R-th micro-batch's output (R = replicas).
at::Tensor stream_sum(at::TensorList micro_batches, int64_t replicas);

}  // namespace streams

// worker_memory.cpp (see [Note: worker memory]): this thread's large allocations from the pool
// (pooled) or not, and whether the pool serves this process; the bytes of idle blocks freed; the
// pool's counters.
bool enter_worker_memory(bool pooled);
int64_t trim_worker_memory();
std::vector<int64_t> worker_memory_stats();

}  // namespace poptorch_sim
