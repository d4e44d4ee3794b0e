// Tile engine state: the simulated tile count and the per-kernel counter table.
// See [Note: tile engine] in tile_engine.h.
#include "tile_engine.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>

#include <c10/util/Exception.h>

namespace poptorch_sim {
namespace engine {

namespace {

std::atomic<int64_t> g_num_tiles{0};
std::mutex g_table_mutex;

std::map<std::string, std::array<int64_t, kNumCounterFields>>& table() {
  static std::map<std::string, std::array<int64_t, kNumCounterFields>> counters;
  return counters;
}

}  // namespace

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
