// Memory for the tensors IPU worker threads allocate, kept mapped between steps.
//
// [Note: worker memory]
// An IPU's memory is laid out when its program is compiled: a step allocates nothing. A CPU step
// of a PyTorch model allocates its activations, gradients and logits afresh, and glibc hands
// blocks of more than 32 MiB (and the trimmed top of its heaps) back to the kernel when they are
// freed, so the next step writes pages the process has just been given: a page fault per 4 KiB.
// Llama's training call (benchmarks/models.py, 10 micro-batches with a 32,000-wide LM head) took
// 550,000-720,000 minor faults a call on a 2-vCPU AMD EPYC Zen 4 VM, eager and simulated alike
// (getrusage's ru_minflt around each call), about a second of its 3.5.
//
// So the CPU allocator of the process becomes this one, and on the threads that asked for it
// (IPU workers, replica threads, the caller's thread during a call: enter_worker_memory), blocks
// of at least kWorkerBlockMin bytes come from a pool, as CUDA tensors come from PyTorch's caching
// allocator: a block goes back to the pool when its last tensor dies (on whichever thread), and
// the next request of the same rounded size (block_size in output_cache.h: whole 4 KiB pages, or
// whole 2 MiB pages with a huge-page hint from 8 MiB) takes a block that is already mapped, or one
// at most a quarter larger. Every other allocation, and every allocation on other threads (the
// user's own eager code), goes to the allocator that was there before, unchanged. Idle blocks are
// kept up to kIdleFactor times the most bytes the pool's tensors have held at once (past it a
// released block is freed), and trim_worker_memory frees them all (when a program's workers
// stop). A loop needs more blocks than its peak in use where tensors of different sizes peak at
// different times: ResNet-50's inference call (benchmarks/models.py) holds 10.8 MiB at most and
// needs 22 MiB of blocks. Kept only up to its peak, the blocks of its 9 MiB weight reorders were
// freed and mapped again (huge pages) every call: 240 faults and about 50 ms of kernel time a
// call, its eager loop 10-17% slower on the pool than on glibc's heap (dev-zen4, 2026-11-26);
// with three times the peak, no new block after the first call. The pool is locked around fork
// so that a child (DataLoader workers) finds it usable; a child frees what it releases instead of
// keeping it. With the pool, the same Llama call took about 105 faults in all (the same harness,
// 2026-11-26).
#include <sys/types.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/CPUAllocator.h>

#include "engine/ops.h"
#include "engine/output_cache.h"

namespace poptorch_sim {
namespace {

constexpr size_t kWorkerBlockMin = size_t{1} << 17;  // smaller blocks: glibc's arenas serve them
constexpr size_t kIdleFactor = 3;  // idle blocks kept: up to this many times the peak in use

thread_local bool t_pooled = false;

class WorkerMemory final : public c10::Allocator {
 public:
  explicit WorkerMemory(c10::Allocator* previous) : previous_(previous) {}

  c10::DataPtr allocate(size_t n) override {
    if (!t_pooled || n < kWorkerBlockMin || getpid() != pid_) {
      return previous_->allocate(n);
    }
    void* data = take(block_size(n));
    return {data, data, &WorkerMemory::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &WorkerMemory::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Frees every idle block; returns how many bytes that was.
  size_t trim() {
    std::vector<void*> freed;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [size, blocks] : idle_) {
        bytes += size * blocks.size();
        freed.insert(freed.end(), blocks.begin(), blocks.end());
      }
      idle_.clear();
      idle_bytes_ = 0;
    }
    for (void* data : freed) {
      std::free(data);
    }
    return bytes;
  }

  std::vector<int64_t> stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {static_cast<int64_t>(in_use_bytes_), static_cast<int64_t>(idle_bytes_),
            static_cast<int64_t>(peak_bytes_), static_cast<int64_t>(hits_),
            static_cast<int64_t>(misses_)};
  }

  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

 private:
  // A block of at least `size` bytes (a multiple of block_size's unit), idle or new.
  void* take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = idle_.lower_bound(size);
      if (it != idle_.end() && it->first <= size + size / 4) {
        void* data = it->second.back();
        it->second.pop_back();
        const size_t got = it->first;
        if (it->second.empty()) {
          idle_.erase(it);
        }
        idle_bytes_ -= got;
        note_in_use(data, got);
        ++hits_;
        return data;
      }
      ++misses_;
    }
    void* data = alloc_block(size);  // throws std::bad_alloc
    std::lock_guard<std::mutex> lock(mutex_);
    note_in_use(data, size);
    return data;
  }

  void note_in_use(void* data, size_t size) {
    live_.emplace(data, size);
    in_use_bytes_ += size;
    peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
  }

  static void release(void* data);

  void keep(void* data) {
    bool ours = false;
    bool kept = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(data);
      if (it != live_.end()) {
        ours = true;
        const size_t size = it->second;
        live_.erase(it);
        in_use_bytes_ -= size;
        if (getpid() == pid_ && idle_bytes_ + size <= kIdleFactor * peak_bytes_) {
          idle_[size].push_back(data);
          idle_bytes_ += size;
          kept = true;
        }
      }
    }
    if (!ours) {  // a raw allocation the previous allocator served
      const c10::DeleterFnPtr deleter = previous_->raw_deleter();
      deleter != nullptr ? deleter(data) : std::free(data);
    } else if (!kept) {
      std::free(data);
    }
  }

  c10::Allocator* const previous_;
  const pid_t pid_ = getpid();
  std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;    // block -> its size, while a tensor holds it
  std::map<size_t, std::vector<void*>> idle_;  // size -> idle blocks of that size
  size_t in_use_bytes_ = 0;
  size_t idle_bytes_ = 0;
  size_t peak_bytes_ = 0;
  size_t hits_ = 0;
  size_t misses_ = 0;
};

WorkerMemory* g_memory = nullptr;  // set once; never destroyed: tensors may outlive exit

void WorkerMemory::release(void* data) { g_memory->keep(data); }

// Installs the pool as the process's CPU allocator (once); false if another allocator of a
// higher priority keeps the place.
bool install() {
  static const bool installed = [] {
    c10::Allocator* previous = c10::GetCPUAllocator();
    g_memory = new WorkerMemory(previous);
    c10::SetCPUAllocator(g_memory, /*priority=*/1);
    pthread_atfork([] { g_memory->lock_for_fork(); }, [] { g_memory->unlock_after_fork(); },
                   [] { g_memory->unlock_after_fork(); });
    return c10::GetCPUAllocator() == g_memory;
  }();
  return installed;
}

}  // namespace

// The calling thread's large allocations come from the pool from now on (or no longer, with
// false). Returns whether the pool serves this process.
bool enter_worker_memory(bool pooled) {
  const bool installed = install();
  t_pooled = pooled && installed;
  return installed;
}

int64_t trim_worker_memory() {
  return g_memory == nullptr ? 0 : static_cast<int64_t>(g_memory->trim());
}

// [bytes in use, idle bytes, most bytes in use at once, requests served idle, new blocks]
std::vector<int64_t> worker_memory_stats() {
  return g_memory == nullptr ? std::vector<int64_t>(5, 0) : g_memory->stats();
}

}  // namespace poptorch_sim
