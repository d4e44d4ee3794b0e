// SIMD level detection and the cap: see [Note: SIMD variants] in simd.h.
#include "common/simd.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include <c10/util/Exception.h>

namespace poptorch_sim {
namespace simd {

namespace {

Level parse(const std::string& text) {
  if (text == "base") {
    return Level::kBase;
  }
  if (text == "avx2") {
    return Level::kAvx2;
  }
  TORCH_CHECK(
      text == "avx512", "poptorch_sim: unknown SIMD level '", text,
      "'; use base, avx2 or avx512 (POPTORCH_SIM_SIMD or kernels.set_simd_level, which also ",
      "takes auto)");
  return Level::kAvx512;
}

Level initial() {
  const char* cap = std::getenv("POPTORCH_SIM_SIMD");
  return cap == nullptr || *cap == '\0' ? supported() : std::min(supported(), parse(cap));
}

std::atomic<Level>& current() {
  static std::atomic<Level> level{initial()};
  return level;
}

std::atomic<bool> pinned{false};  // set_level named a level: it overrides the choices

constexpr int kFamilies = static_cast<int>(Family::kCount);
constexpr int kLevels = static_cast<int>(Level::kAvx512) + 1;
// Each family's measured choice, as its level + 1 (0, where static storage starts: none).
std::atomic<int> choices[kFamilies];
std::atomic<int64_t> run_counts[kFamilies][kLevels];

int family_index(const std::string& family) {
  const auto& names = family_names();
  for (int i = 0; i < kFamilies; ++i) {
    if (names[i] == family) {
      return i;
    }
  }
  std::string known;
  for (const auto& name : names) {
    known += (known.empty() ? "" : ", ") + name;
  }
  TORCH_CHECK(false, "poptorch_sim: unknown kernel family '", family, "'; use one of ", known);
  return 0;
}

}  // namespace

Level level(Family family) {
  const Level cap = level();
  const int choice = choices[static_cast<int>(family)].load(std::memory_order_relaxed);
  if (choice == 0 || pinned.load(std::memory_order_relaxed)) {
    return cap;
  }
  return std::min(cap, static_cast<Level>(choice - 1));
}

Level run_level(Family family) {
  const Level chosen = level(family);
  run_counts[static_cast<int>(family)][static_cast<int>(chosen)].fetch_add(
      1, std::memory_order_relaxed);
  return chosen;
}

std::vector<int64_t> runs(Family family) {
  std::vector<int64_t> counts;
  for (const auto& count : run_counts[static_cast<int>(family)]) {
    counts.push_back(count.load(std::memory_order_relaxed));
  }
  return counts;
}

const std::vector<std::string>& family_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const char* length : {"16", "256", "1024", "4096", "32768"}) {
      for (const char* bits : {"16", "32", "64"}) {
        all.push_back(std::string("sort_rows_") + length + "_" + bits + "bit");
      }
    }
    for (const char* name : {"sort_long_16bit", "sort_long_32bit", "nms", "accumulate",
                             "optimizer"}) {
      all.push_back(name);
    }
    TORCH_INTERNAL_ASSERT(all.size() == kFamilies, "one name per simd::Family");
    return all;
  }();
  return names;
}

std::string set_choice(const std::string& family, const std::string& text) {
  const int index = family_index(family);
  const int wanted = text.empty() ? 0 : static_cast<int>(parse(text)) + 1;
  const int previous = choices[index].exchange(wanted, std::memory_order_relaxed);
  return previous == 0 ? "" : name(static_cast<Level>(previous - 1));
}

Level supported() {
  static const Level best = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      return Level::kBase;
    }
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    return avx512 ? Level::kAvx512 : Level::kAvx2;
  }();
  return best;
}

Level level() { return current().load(std::memory_order_relaxed); }

std::string set_level(const std::string& text) {
  const bool pin = text != "auto";
  const Level wanted = pin ? std::min(supported(), parse(text)) : initial();
  const bool was_pinned = pinned.exchange(pin, std::memory_order_relaxed);
  const Level previous = current().exchange(wanted, std::memory_order_relaxed);
  return was_pinned ? name(previous) : "auto";
}

const char* name(Level level) {
  switch (level) {
    case Level::kBase:
      return "base";
    case Level::kAvx2:
      return "avx2";
    default:
      return "avx512";
  }
}

}  // namespace simd
}  // namespace poptorch_sim
