// The tile engine: the IPU's bulk-synchronous model in miniature.
//
// [Note: tile engine]
// An IPU runs a program as a sequence of supersteps. In each superstep every tile computes on
// its own memory, then all tiles synchronise and exchange data. Kernels here are written the
// same way: work is split over `num_tiles()` simulated tiles, a superstep runs one compute
// function per tile on the engine's host threads (as many as torch.get_num_threads()), and the kernel records what a profiler wants to know about it:
//
//   counter            meaning
//   calls              kernel invocations
//   supersteps         compute+exchange phases run
//   compare_exchanges  comparisons of a sorting network or merge (sort, topk, NMS order)
//   flops              arithmetic operations (NMS IoU: 12 per box pair)
//   bytes_exchanged    bytes that crossed between tiles in exchange phases
//
// The simulated tile count is independent of the number of host threads: with more tiles than
// threads, each thread runs several tiles of a superstep one after another, as a real IPU's
// tiles would run their six worker contexts.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>


namespace poptorch_sim {
namespace engine {

// Field order of the rows returned by `counter_table`.
enum CounterField : int {
  kCalls = 0,
  kSupersteps,
  kCompareExchanges,
  kFlops,
  kBytesExchanged,
  kNumCounterFields
};

// Names of the fields, in `CounterField` order.
const std::vector<std::string>& counter_field_names();

// Simulated tiles a kernel splits its work over (default: the host's intra-op thread count).
int64_t num_tiles();
// Sets the simulated tile count (0: the default) and returns the previous setting (0 when it
// was the default). Raises on negative values.
int64_t set_num_tiles(int64_t tiles);

// Adds one kernel's counters to the global table (thread-safe).
void record(const std::string& kernel, const int64_t (&values)[kNumCounterFields]);
// A snapshot of every kernel's counters: names and rows in `CounterField` order.
void counter_table(std::vector<std::string>& names, std::vector<int64_t>& flat);
// Clears the table.
void reset_counters();

// Runs compute(tile) for tile in [0, tiles) on PyTorch's intra-op threads, the caller among them.
// See [Note: tile pool] in tile_engine.cpp. Rethrows the first exception a tile raised.
void run_tiles(int64_t tiles, const std::function<void(int64_t)>& compute);

// Below this much work (elements, roughly) a superstep runs its tiles on the calling thread.
constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// One kernel invocation on the engine. Counters accumulate in the scope and are published when
// it ends, so a kernel that fails half-way still reports what it did.
class KernelScope {
 public:
  explicit KernelScope(std::string name) : name_(std::move(name)) {}
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
  ~KernelScope();

  // Runs `compute(tile)` for every tile in [0, tiles) on the thread pool; one superstep.
  // `work` (elements touched, roughly) below kMinParallelWork runs the tiles in turn on the
  // calling thread: waking the pool costs more than such a superstep.
  template <typename F>
  void superstep(int64_t tiles, const F& compute, int64_t work = INT64_MAX) {
    supersteps_.fetch_add(1, std::memory_order_relaxed);
    if (tiles <= 0) {
      return;
    }
    if (work < kMinParallelWork) {
      for (int64_t tile = 0; tile < tiles; ++tile) {
        compute(tile);
      }
      return;
    }
    if (tiles == 1) {
      compute(int64_t{0});
      return;
    }
    run_tiles(tiles, compute);
  }

  void add_compare_exchanges(int64_t n) { compares_.fetch_add(n, std::memory_order_relaxed); }
  void add_flops(int64_t n) { flops_.fetch_add(n, std::memory_order_relaxed); }
  void add_bytes_exchanged(int64_t n) { bytes_.fetch_add(n, std::memory_order_relaxed); }
  void add_supersteps(int64_t n) { supersteps_.fetch_add(n, std::memory_order_relaxed); }

 private:
  std::string name_;
  std::atomic<int64_t> supersteps_{0};
  std::atomic<int64_t> compares_{0};
  std::atomic<int64_t> flops_{0};
  std::atomic<int64_t> bytes_{0};
};

// Splits [0, n) into `parts` near-equal contiguous ranges; returns the start of range `part`.
inline int64_t split_point(int64_t n, int64_t parts, int64_t part) {
  return n / parts * part + std::min(part, n % parts);
}

}  // namespace engine
}  // namespace poptorch_sim
