// Run-time choice between the SIMD variants of the hot loops.
//
// [Note: SIMD variants]
// The element loops are plain C++ compiled more than once: for the baseline x86-64 ISA (SSE2),
// with POPSIM_AVX2 and with POPSIM_AVX512, and each call site picks a variant by simd::level(),
// so one build runs on any x86-64 CPU and uses the widest vectors it has. Every variant does the
// same IEEE operations per element in the same order (no fused multiply-add unless the source
// calls fmaf; the build passes -ffp-contract=off), so they give identical bits: the tests run
// every variant this CPU has against the others. The level is the best the CPU supports, capped
// by the environment variable POPTORCH_SIM_SIMD (base, avx2 or avx512) or by set_level.
#pragma once

#include <string>

#define POPSIM_AVX2 __attribute__((target("avx2,fma")))
#define POPSIM_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

namespace poptorch_sim {
namespace simd {

enum class Level { kBase = 0, kAvx2 = 1, kAvx512 = 2 };

// The variant the kernels use now.
Level level();

// The best variant this CPU supports.
Level supported();

// Caps the variant at `name` (base, avx2 or avx512; clamped to what the CPU supports) and
// returns the previous level's name. Throws for another name.
std::string set_level(const std::string& name);

const char* name(Level level);

// The variant for `level` among a function's three compilations:
// pick(level(), f_avx512, f_avx2, f_base)(args...).
template <typename F>
F pick(Level level, F avx512, F avx2, F base) {
  switch (level) {
    case Level::kAvx512:
      return avx512;
    case Level::kAvx2:
      return avx2;
    default:
      return base;
  }
}

}  // namespace simd
}  // namespace poptorch_sim
