// The ops of torch.ops.poptorch_sim: every family's schemas and kernels, registered here, and
// the tile engine's own ops (its counters, its tile count and the SIMD level of each kernel
// family).
//
// The one file that includes <torch/library.h> and torch's operator headers: the kernels' files
// include <ATen/core/Tensor.h> at most and declare their ops in their family's ops.h, and new
// tensors come from common/tensors.h, defined here. See [Note: build time] in setup.py.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <torch/library.h>

#include "common/simd.h"
#include "common/tensors.h"
#include "engine/ops.h"
#include "engine/tile_engine.h"
#include "optim/ops.h"
#include "sort/bitonic/rows.h"
#include "sort/ops.h"

namespace poptorch_sim {

at::Tensor empty_tensor(at::IntArrayRef sizes, at::TensorOptions options) {
  return at::empty(sizes, options);
}

at::Tensor empty_tensor_like(const at::Tensor& like) { return at::empty_like(like); }

at::Tensor scalar_tensor(double value, at::ScalarType dtype) {
  return at::scalar_tensor(value, dtype);
}

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

// The sorting family (csrc/sort).
TORCH_LIBRARY_FRAGMENT(poptorch_sim, m) {
  m.def(
      "sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)");
  m.def("argsort(Tensor self, int dim=-1, bool descending=False) -> Tensor");
  m.def(
      "topk(Tensor self, int k, int dim=-1, bool largest=True, bool sorted=True) "
      "-> (Tensor values, Tensor indices)");
  m.def("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
  m.def("batched_nms(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor");
  // A test hook, not a kernel: one function for every device (check_sortable wants a CPU
  // tensor). And the measured choice of [Note: streaming stores].
  m.def("_sort_rows_8_lanes(Tensor self, bool descending=False) -> (Tensor values, Tensor indices)",
        &poptorch_sim::sorting::sort_rows_8_lanes);
  m.def("_sort_rows_8_lanes_built() -> bool", &poptorch_sim::sorting::sort_rows_8_lanes_built);
  m.def("sort_set_stream_mid_rows(bool stream) -> bool",
        &poptorch_sim::sorting::bitonic::set_stream_mid_rows);
  m.def("sort_stream_mid_rows() -> bool", &poptorch_sim::sorting::bitonic::stream_mid_rows);
}

TORCH_LIBRARY_IMPL(poptorch_sim, CPU, m) {
  m.impl("sort", &poptorch_sim::sorting::sort_cpu);
  m.impl("argsort", &poptorch_sim::sorting::argsort_cpu);
  m.impl("topk", &poptorch_sim::sorting::topk_cpu);
  m.impl("nms", &poptorch_sim::nms::nms_cpu);
  m.impl("batched_nms", &poptorch_sim::nms::batched_nms_cpu);
}

// The optimizer family (csrc/optim). The steps' schemas and kernels come from their table
// (optim/ops.h), which module.cpp binds as Python functions too.
TORCH_LIBRARY_FRAGMENT(poptorch_sim, m) {
#define POPSIM_DEF(FN, RELEASE_GIL, SCHEMA) m.def(SCHEMA);
  POPTORCH_SIM_OPTIM_OPS(POPSIM_DEF)
#undef POPSIM_DEF
  m.def("grad_norm(Tensor[] grads, float loss_scaling) -> Tensor");
  m.def("accumulate_(Tensor(a!) accum, Tensor grad, float scale) -> ()");
  m.def("accumulate_many_(Tensor(a!)[] accums, Tensor[] grads, float scale) -> ()");
  m.def("offload_stats() -> int[]", &poptorch_sim::optim::offload_stats);
  m.def("offload_reset_stats() -> ()", &poptorch_sim::optim::offload_reset_stats);
}

TORCH_LIBRARY_IMPL(poptorch_sim, CPU, m) {
  using namespace poptorch_sim::optim;
#define POPSIM_IMPL(FN, RELEASE_GIL, SCHEMA) m.impl(op_name(SCHEMA).c_str(), &FN);
  POPTORCH_SIM_OPTIM_OPS(POPSIM_IMPL)
#undef POPSIM_IMPL
  m.impl("grad_norm", &grad_norm);
  m.impl("accumulate_", &poptorch_sim::accumulate::accumulate_);
  m.impl("accumulate_many_", &poptorch_sim::accumulate::accumulate_many_);
}

// The engine family's ops from outside this file (csrc/engine).
TORCH_LIBRARY_FRAGMENT(poptorch_sim, m) {
  m.def("stream_sum(Tensor[] micro_batches, int replicas) -> Tensor");
  m.def("enter_worker_memory(bool pooled) -> bool", &poptorch_sim::enter_worker_memory);
  m.def("trim_worker_memory() -> int", &poptorch_sim::trim_worker_memory);
  m.def("worker_memory_stats() -> int[]", &poptorch_sim::worker_memory_stats);
}

TORCH_LIBRARY_IMPL(poptorch_sim, CPU, m) {
  m.impl("stream_sum", &poptorch_sim::streams::stream_sum);
}
