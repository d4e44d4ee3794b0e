// Run-time choice between the SIMD variants of the hot loops.
//
// [Note: SIMD variants]
// The element loops are plain C++ compiled more than once: for the baseline x86-64 ISA (SSE2),
// with POPSIM_AVX2 and with POPSIM_AVX512, and each call site picks a variant by simd::level(),
// so one build runs on any x86-64 CPU and uses the widest vectors it has. Every variant does the
// same IEEE operations per element in the same order (no fused multiply-add unless the source
// calls fmaf; the build passes -ffp-contract=off), so they give identical bits: the tests run
// every variant this CPU has against the others. The level is the best the CPU supports, capped
// by the environment variable POPTORCH_SIM_SIMD (base, avx2 or avx512) or set by set_level.
//
// [Note: measured variants]
// The widest variant is not always the fastest (GCC's code for one can be worse than for a
// narrower one, or a CPU can slow its clock for wide vectors), so each kernel family (a Family
// below) runs the variant measured fastest on this CPU: poptorch_sim.kernels.simd_choice times
// every variant the cap allows on a small sample, keeps the fastest, and caches the choice per
// CPU model and build (under XDG_CACHE_HOME), setting it here with set_choice. level(family) is
// that choice under the cap; set_level pins every family at its level until set_level("auto").
// (A 16-core AVX-512 Xeon, 2026-11-25: measuring took 0.1 s and picked avx512 for every family;
// capped at avx2, it picked base for the long-row sorts, 2.21 against 2.28 ms.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#define POPSIM_AVX2 __attribute__((target("avx2,fma")))
#define POPSIM_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

namespace poptorch_sim {
namespace simd {

enum class Level { kBase = 0, kAvx2 = 1, kAvx512 = 2 };

// Kernel families that run their measured variant (see [Note: measured variants]). The bitonic
// row sort by row length class (up to 16, 256, 1024, 4096 and 32768 items) and key width (16-bit
// keys run the network on 32-bit items past 16 items, 64-bit keys the window of [Note: wide
// keys], the others the packed 64-bit items, and rows of up to 1024 windowed 32-bit items: see
// sorting::row_sort_family), the sorts of longer rows (scatter sort, base cases) of 16-bit and of
// 32-bit keys (64-bit keys have no SIMD variants there), NMS, accumulation and the optimizer
// steps.
enum class Family {
  kSortRows16Bits16,
  kSortRows16Bits32,
  kSortRows16Bits64,
  kSortRows256Bits16,
  kSortRows256Bits32,
  kSortRows256Bits64,
  kSortRows1024Bits16,
  kSortRows1024Bits32,
  kSortRows1024Bits64,
  kSortRows4096Bits16,
  kSortRows4096Bits32,
  kSortRows4096Bits64,
  kSortRows32768Bits16,
  kSortRows32768Bits32,
  kSortRows32768Bits64,
  kSortLongBits16,
  kSortLongBits32,
  kNms,
  kAccumulate,
  kOptimizer,
  kCount
};

// The cap: the variant every kernel uses at most (or, after set_level, exactly).
Level level();

// The variant `family` uses now: its measured choice under the cap, or the cap when it has no
// choice or set_level pinned the level.
Level level(Family family);

// The families' names (sort_rows_16_16bit, ..., optimizer), in Family order.
const std::vector<std::string>& family_names();

// level(family), counted as one run of that variant (see runs): what a kernel reads once per
// call to pick its variant.
Level run_level(Family family);

// How many times run_level gave each variant of `family` in this process, in Level order (base,
// avx2, avx512): which variant the kernels of a family ran, for the tests and reports.
std::vector<int64_t> runs(Family family);

// Sets `family`'s measured choice to `level` (a level name, or "" for none) and returns the
// previous one ("" for none). Throws for an unknown family or level.
std::string set_choice(const std::string& family, const std::string& level);

// The best variant this CPU supports.
Level supported();

// Pins every family at `name` (base, avx2 or avx512; clamped to what the CPU supports), or with
// "auto" goes back to the measured choices under POPTORCH_SIM_SIMD's cap; returns the previous
// setting ("auto" or a level's name). Throws for another name.
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
