// SIMD level detection and the cap: see [Note: SIMD variants] in simd.h.
#include "simd.h"

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
      "'; use base, avx2 or avx512 (POPTORCH_SIM_SIMD or kernels.set_simd_level)");
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

}  // namespace

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
  const Level wanted = std::min(supported(), parse(text));
  return name(current().exchange(wanted, std::memory_order_relaxed));
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
