// The optimizer family's ops: the fused optimizer steps (each step's schema and C++ function,
// written once), gradient accumulation, the gradient norm and the off-chip streaming counters.
// library.cpp registers them all.
//
// [Note: two calls of one op]
// Each step is registered twice from this table: as a dispatcher op (optimizer.cpp), which is
// what torch.compile, fake tensors and opcheck see, and as a Python function of the same name in
// poptorch_sim._C (module.cpp), which FusedOptimizer's eager CPU step calls. From Python, the
// dispatcher converts every tensor of every list through the JIT's schema matching; pybind11's
// conversion of the same lists costs less. Adam over 1000 float32 params of 64 elements, one
// thread, medians of 15 calls: 0.61 ms through torch.ops, 0.41 ms through the Python function
// (SGD 0.47 / 0.32 ms, increment_steps_ 0.12 / 0.06 ms; 2-core AMD EPYC, quiet, 2026-11-25).
// Both calls run the same function with the same arguments: the table holds the only list of
// them (the schema), and module.cpp derives the Python signature from the C++ one.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "optim/optimizer.h"

// OP(function, release the GIL in the Python call, schema); the op is named in its schema.
#define POPTORCH_SIM_OPTIM_OPS(OP)                                                              \
  OP(sgd_step, true,                                                                           \
     "sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, *, "       \
     "float lr, float momentum, float dampening, float weight_decay, bool nesterov, "          \
     "bool maximize, bool first_step, float loss_scaling, float clip_coef, "                   \
     "int chunk_elements) -> ()")                                                              \
  OP(adam_step, true,                                                                          \
     "adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "                 \
     "Tensor(c!)[] exp_avg_sqs, float[] steps, *, float lr, float beta1, float beta2, "        \
     "float eps, float weight_decay, bool decoupled_weight_decay, bool bias_correction, "      \
     "bool maximize, float loss_scaling, float clip_coef, int chunk_elements) -> ()")          \
  OP(rmsprop_step, true,                                                                       \
     "rmsprop_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] square_avgs, "           \
     "Tensor(c!)[] momentum_buffers, Tensor(d!)[] grad_avgs, *, float lr, float alpha, "       \
     "float eps, float weight_decay, float momentum, bool centered, bool maximize, "           \
     "bool use_tf_variant, float loss_scaling, float clip_coef, int chunk_elements) -> ()")    \
  OP(lamb_step, true,                                                                          \
     "lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "                 \
     "Tensor(c!)[] exp_avg_sqs, float[] steps, *, float lr, float beta1, float beta2, "        \
     "float eps, float weight_decay, float max_weight_norm, bool bias_correction, "            \
     "float loss_scaling, float clip_coef, int chunk_elements) -> ()")                         \
  OP(increment_steps, false, "increment_steps_(Tensor(a!)[] steps) -> float[]")

namespace poptorch_sim {
namespace accumulate {

// accumulate.cpp: accum += grad * scale, in place.
void accumulate_(at::Tensor& accum, const at::Tensor& grad, double scale);
void accumulate_many_(at::TensorList accums, at::TensorList grads, double scale);

}  // namespace accumulate

namespace optim {

// optimizer.cpp: the 2-norm of the unscaled gradients, as one float32 scalar tensor.
at::Tensor grad_norm(at::TensorList grads, double loss_scaling);

// offload.cpp: [chunks, bytes to the device, bytes to the host] streamed since the last reset.
std::vector<int64_t> offload_stats();
void offload_reset_stats();

// An op's name: its schema up to the argument list.
inline std::string op_name(const char* schema) {
  return std::string(schema, std::strchr(schema, '('));
}

}  // namespace optim
}  // namespace poptorch_sim
