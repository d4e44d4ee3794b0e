// Tile engine state: the simulated tile count and the per-kernel counter table.
// See [Note: tile engine] in tile_engine.h.
#include "tile_engine.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>

#include <condition_variable>
#include <exception>
#include <memory>
#include <thread>

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
// Tiles are claimed one at a time from an atomic counter, by the calling thread and by any
// pool thread that is awake, and the superstep ends when every tile is done. The caller never
// waits for a helper that has not started yet: on a loaded machine, where a helper may sit
// descheduled for milliseconds, the caller simply runs the remaining tiles itself. (A static
// split with a join barrier, such as an OpenMP parallel for, would wait for the slowest thread.)
// Helpers that wake late find no tile left and go back to sleep; the job lives in a shared_ptr
// so it outlives the call for them. A superstep started inside another runs inline, and a
// forked child (DataLoader workers) runs everything on its calling thread.
struct Job {
  const std::function<void(int64_t)>* compute = nullptr;
  int64_t tiles = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
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
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

thread_local bool t_inside_superstep = false;

class TilePool {
 public:
  void run(int64_t tiles, const std::function<void(int64_t)>& compute) {
    const int helpers = std::max(0, at::get_num_threads() - 1);
    if (helpers == 0 || t_inside_superstep || getpid() != pid_) {
      for (int64_t tile = 0; tile < tiles; ++tile) {
        compute(tile);
      }
      return;
    }
    auto job = std::make_shared<Job>();
    job->compute = &compute;
    job->tiles = tiles;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(threads_) < helpers) {
        std::thread(&TilePool::helper_loop, this).detach();
        ++threads_;
      }
      current_ = job;
      ++generation_;
    }
    wake_.notify_all();
    t_inside_superstep = true;
    job->work();
    t_inside_superstep = false;
    while (job->done.load(std::memory_order_acquire) < tiles) {
      std::this_thread::yield();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (current_ == job) {
        current_.reset();
      }
    }
    if (job->error) {
      std::rethrow_exception(job->error);
    }
  }

 private:
  void helper_loop() {
    t_inside_superstep = true;
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = current_;
      }
      if (job) {
        job->work();
      }
    }
  }

  const pid_t pid_ = getpid();
  std::mutex mutex_;
  std::condition_variable wake_;
  std::shared_ptr<Job> current_;
  uint64_t generation_ = 0;
  size_t threads_ = 0;
};

TilePool& pool() {
  static TilePool* instance = new TilePool();  // never destroyed: helpers are detached
  return *instance;
}

}  // namespace

void run_tiles(int64_t tiles, const std::function<void(int64_t)>& compute) {
  pool().run(tiles, compute);
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
