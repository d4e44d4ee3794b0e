// The tile engine's ops: its counters, its tile count and the SIMD level of each kernel family.
// Each family of ops (engine, sort, optim) defines its schemas with TORCH_LIBRARY_FRAGMENT in
// the file of its kernels.
#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <torch/library.h>

#include "common/simd.h"
#include "engine/tile_engine.h"

namespace poptorch_sim {
namespace {

std::tuple<std::vector<std::string>, std::vector<std::string>, at::Tensor> engine_counters() {
  std::vector<std::string> kernels;
  std::vector<int64_t> flat;
  engine::counter_table(kernels, flat);
  const int64_t fields = engine::kNumCounterFields;
  at::Tensor table =
      at::tensor(flat, at::TensorOptions().dtype(at::kLong)).reshape({-1, fields}).clone();
  return {kernels, engine::counter_field_names(), table};
}

void engine_reset_counters() { engine::reset_counters(); }

int64_t engine_num_tiles() { return engine::num_tiles(); }

int64_t engine_set_num_tiles(int64_t tiles) { return engine::set_num_tiles(tiles); }

std::string engine_simd_level() { return simd::name(simd::level()); }

std::string engine_supported_simd_level() { return simd::name(simd::supported()); }

std::string engine_set_simd_level(std::string level) { return simd::set_level(level); }

std::vector<std::string> engine_simd_families() { return simd::family_names(); }

std::string engine_set_simd_choice(std::string family, std::string level) {
  return simd::set_choice(family, level);
}

simd::Family family_named(const std::string& family) {
  const auto& names = simd::family_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == family) {
      return static_cast<simd::Family>(i);
    }
  }
  simd::set_choice(family, "");  // throws: unknown family
  return simd::Family::kCount;
}

std::string engine_simd_family_level(std::string family) {
  return simd::name(simd::level(family_named(family)));
}

std::vector<int64_t> engine_simd_family_runs(std::string family) {
  return simd::runs(family_named(family));
}

}  // namespace
}  // namespace poptorch_sim

TORCH_LIBRARY_FRAGMENT(poptorch_sim, m) {
  m.def("engine_counters() -> (str[] kernels, str[] fields, Tensor table)",
        &poptorch_sim::engine_counters);
  m.def("engine_reset_counters() -> ()", &poptorch_sim::engine_reset_counters);
  m.def("engine_num_tiles() -> int", &poptorch_sim::engine_num_tiles);
  m.def("engine_set_num_tiles(int tiles) -> int", &poptorch_sim::engine_set_num_tiles);
  m.def("engine_simd_level() -> str", &poptorch_sim::engine_simd_level);
  m.def("engine_supported_simd_level() -> str", &poptorch_sim::engine_supported_simd_level);
  m.def("engine_set_simd_level(str level) -> str", &poptorch_sim::engine_set_simd_level);
  m.def("engine_simd_families() -> str[]", &poptorch_sim::engine_simd_families);
  m.def("engine_set_simd_choice(str family, str level) -> str",
        &poptorch_sim::engine_set_simd_choice);
  m.def("engine_simd_family_level(str family) -> str", &poptorch_sim::engine_simd_family_level);
  m.def("engine_simd_family_runs(str family) -> int[]", &poptorch_sim::engine_simd_family_runs);
}
