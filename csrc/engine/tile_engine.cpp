// Tile engine state: the simulated tile count and the per-kernel counter table.
// See [Note: tile engine] in tile_engine.h.
#include "engine/tile_engine.h"

#include <algorithm>
#include <array>
#include <exception>
#include <map>
#include <mutex>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <unistd.h>

namespace poptorch_sim {
namespace engine {

namespace {

std::atomic<int64_t> g_num_tiles{0};
std::mutex g_table_mutex;

std::map<std::string, std::array<int64_t, kNumCounterFields>>& table() {
  static std::map<std::string, std::array<int64_t, kNumCounterFields>> counters;
  return counters;
}

// [Note: tile pool]
// A superstep runs on PyTorch's intra-op threads (at::parallel_for): one task per thread, and
// each task claims tiles one at a time from an atomic counter until none is left, so a thread
// that starts late finds the work already done by the others (the call still waits at the end
// for every thread to have started, which on a loaded machine can cost a scheduling delay; the
// engine's own pool did not, but lost more to the case below). Those are the threads torch's own
// CPU ops run on; after an op they spin for a while before sleeping (OpenMP's wait policy), and a
// pool of our own would then share the cores with them: a 2^20-item sort of short rows took
// 1.7-2x as long right after torch.sort as on its own (benchmarks/kernels.py, two cores). On
// torch's threads the kernel starts on the spinning threads instead. A superstep started inside
// another runs inline, and a forked child (DataLoader workers) runs everything on its calling
// thread.
struct Job {
  const std::function<void(int64_t)>* compute = nullptr;
  int64_t tiles = 0;
  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  // Claims and runs tiles until none is left.
  void work() {
    for (int64_t tile = next.fetch_add(1); tile < tiles; tile = next.fetch_add(1)) {
      try {
        (*compute)(tile);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) {
          error = std::current_exception();
        }
      }
    }
  }
};

const pid_t g_pid = getpid();

}  // namespace

void run_tiles(int64_t tiles, const std::function<void(int64_t)>& compute) {
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), tiles);
  if (threads <= 1 || at::in_parallel_region() || getpid() != g_pid) {
    for (int64_t tile = 0; tile < tiles; ++tile) {
      compute(tile);
    }
    return;
  }
  Job job;
  job.compute = &compute;
  job.tiles = tiles;
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { job.work(); });
  if (job.error) {
    std::rethrow_exception(job.error);
  }
}

const std::vector<std::string>& counter_field_names() {
  static const std::vector<std::string> names = {
      "calls", "supersteps", "compare_exchanges", "flops", "bytes_exchanged"};
  return names;
}

int64_t num_tiles() {
  const int64_t configured = g_num_tiles.load(std::memory_order_relaxed);
  if (configured > 0) {
    return configured;
  }
  return std::max<int64_t>(1, at::get_num_threads());
}

int64_t set_num_tiles(int64_t tiles) {
  TORCH_CHECK(
      tiles >= 0,
      "engine_set_num_tiles: the tile count must be >= 0 (0 restores the default of one tile "
      "per host thread), got ",
      tiles);
  return g_num_tiles.exchange(tiles, std::memory_order_relaxed);
}

void record(const std::string& kernel, const int64_t (&values)[kNumCounterFields]) {
  std::lock_guard<std::mutex> lock(g_table_mutex);
  auto& row = table()[kernel];
  for (int field = 0; field < kNumCounterFields; ++field) {
    row[field] += values[field];
  }
}

void counter_table(std::vector<std::string>& names, std::vector<int64_t>& flat) {
  std::lock_guard<std::mutex> lock(g_table_mutex);
  names.clear();
  flat.clear();
  for (const auto& entry : table()) {
    names.push_back(entry.first);
    flat.insert(flat.end(), entry.second.begin(), entry.second.end());
  }
}

void reset_counters() {
  std::lock_guard<std::mutex> lock(g_table_mutex);
  table().clear();
}

KernelScope::~KernelScope() {
  const int64_t values[kNumCounterFields] = {
      1,
      supersteps_.load(),
      compares_.load(),
      flops_.load(),
      bytes_.load(),
  };
  record(name_, values);
}

}  // namespace engine
}  // namespace poptorch_sim
