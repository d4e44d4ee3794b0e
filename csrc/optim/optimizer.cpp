// Fused optimizer updates (SGD, Adam/AdamW, RMSprop, LAMB) over lists of flat parameter buffers.
//
// Each op updates params and states in place, one pass over memory per parameter (LAMB: two,
// its trust ratio needs two norms first). Gradients arrive multiplied by the loss scale and are
// divided by it, then multiplied by the clip coefficient, exactly as
// `p.grad /= loss_scaling; clip_grad_norm_(...); opt.step()` would; the element formulas and
// their operation order follow torch/optim/*.py (`foreach=False`). See [Note: optimizer tiles].
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/tensors.h"
#include "engine/tile_engine.h"
#include "optim/ops.h"
#include "optim/optimizer.h"
#include "optim/optimizer_tiles.h"

namespace poptorch_sim {
namespace optim {
namespace {

// ---------------------------------------------------------------- operands and checks

bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

void check_buffer(const at::Tensor& t, const char* what, int64_t i, const at::Tensor& param) {
  TORCH_CHECK(t.defined(), what, "[", i, "] is undefined");
  TORCH_CHECK(t.device().is_cpu(), what, "[", i, "] must be a CPU tensor, got device ", t.device());
  TORCH_CHECK(
      is_supported_float(t.scalar_type()), what, "[", i,
      "] must be float32, float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(
      t.sizes() == param.sizes(), what, "[", i, "] has shape ", t.sizes(),
      " but params[", i, "] has shape ", param.sizes());
  TORCH_CHECK(t.is_contiguous(), what, "[", i, "] must be contiguous (a flat buffer)");
}

// Builds the per-parameter operands; `states` holds one list per state kind (all lists the
// same length as params).
std::vector<ParamOperands> gather(
    const at::TensorList& params,
    const at::TensorList& grads,
    const std::vector<std::pair<const char*, at::TensorList>>& states) {
  TORCH_CHECK(
      params.size() == grads.size(), "params and grads must have the same length, got ",
      params.size(), " params and ", grads.size(), " grads");
  for (const auto& st : states) {
    TORCH_CHECK(
        st.second.size() == params.size(), st.first, " must have one tensor per param, got ",
        st.second.size(), " for ", params.size(), " params");
  }
  std::vector<ParamOperands> out;
  out.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    check_buffer(p, "params", static_cast<int64_t>(i), p);
    check_buffer(grads[i], "grads", static_cast<int64_t>(i), p);
    ParamOperands ops{p, grads[i], {}};
    for (const auto& st : states) {
      check_buffer(st.second[i], st.first, static_cast<int64_t>(i), p);
      ops.states.push_back(st.second[i]);
    }
    out.push_back(std::move(ops));
  }
  return out;
}

void check_common(double loss_scaling, double clip_coef, int64_t chunk_elements) {
  TORCH_CHECK(
      loss_scaling > 0.0 && std::isfinite(loss_scaling),
      "loss_scaling must be a positive finite number, got ", loss_scaling);
  TORCH_CHECK(clip_coef >= 0.0, "clip_coef must be >= 0, got ", clip_coef);
  TORCH_CHECK(
      chunk_elements >= 0 && chunk_elements % kTile == 0,
      "chunk_elements must be 0 (state on-chip) or a positive multiple of ", kTile,
      ", got ", chunk_elements);
}

void check_steps(const at::ArrayRef<double>& steps, size_t n) {
  TORCH_CHECK(
      steps.size() == n, "steps must have one entry per param, got ", steps.size(),
      " for ", n, " params");
  for (size_t i = 0; i < steps.size(); ++i) {
    TORCH_CHECK(steps[i] >= 1.0, "steps[", i, "] must be >= 1 (the step being taken), got ",
                steps[i]);
  }
}

GradPrep grad_prep(double loss_scaling, double clip_coef, bool maximize) {
  const float ls = static_cast<float>(loss_scaling);
  const float inverse = 1.0f / ls;
  int exponent = 0;
  const bool power_of_two = std::frexp(ls, &exponent) == 0.5f;
  return {ls, inverse, static_cast<float>(clip_coef), maximize,
          power_of_two && std::isnormal(inverse)};
}

// Publishes one update to the tile engine's counters: one superstep per parameter and about
// `flops_per_element` arithmetic operations per element.
void count_update(const char* kernel, const std::vector<ParamOperands>& all,
                  int64_t flops_per_element) {
  engine::KernelScope scope(kernel);
  int64_t elements = 0;
  for (const auto& ops : all) {
    elements += ops.param.numel();
  }
  scope.add_supersteps(static_cast<int64_t>(all.size()));
  scope.add_flops(elements * flops_per_element);
}

}  // namespace

// ---------------------------------------------------------------- ops

void sgd_step(
    at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr,
    double momentum, double dampening, double weight_decay, bool nesterov, bool maximize,
    bool first_step, double loss_scaling, double clip_coef, int64_t chunk_elements) {
  check_common(loss_scaling, clip_coef, chunk_elements);
  const bool has_momentum = momentum != 0.0;
  TORCH_CHECK(
      has_momentum || momentum_buffers.empty(),
      "momentum_buffers must be empty when momentum is 0, got ", momentum_buffers.size());
  TORCH_CHECK(!nesterov || (has_momentum && dampening == 0.0),
              "Nesterov momentum requires a momentum and zero dampening, got momentum=",
              momentum, " dampening=", dampening);
  std::vector<std::pair<const char*, at::TensorList>> states;
  if (has_momentum) {
    states.emplace_back("momentum_buffers", momentum_buffers);
  }
  const auto all = gather(params, grads, states);
  count_update("sgd_step_", all, 8);
  SgdHyper h{grad_prep(loss_scaling, clip_coef, maximize),
             static_cast<float>(-lr),
             static_cast<float>(momentum),
             static_cast<float>(1.0 - dampening),
             static_cast<float>(weight_decay),
             nesterov,
             first_step};
  for_each_tile_all(all, chunk_elements, true, [&](size_t, const TileView& v) {
    TileView w = v;
    if (!has_momentum) {
      w.state[0] = nullptr;
    }
    sgd_tile(h, w);
  });
}

void adam_step(
    at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs, at::ArrayRef<double> steps, double lr, double beta1,
    double beta2, double eps, double weight_decay, bool decoupled_weight_decay,
    bool bias_correction, bool maximize, double loss_scaling, double clip_coef,
    int64_t chunk_elements) {
  check_common(loss_scaling, clip_coef, chunk_elements);
  const auto all =
      gather(params, grads, {{"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}});
  check_steps(steps, all.size());
  count_update("adam_step_", all, 16);
  // Bias corrections depend on the step only: computed once per distinct step number.
  std::vector<AdamHyper> hypers;
  hypers.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0 && steps[i] == steps[i - 1]) {
      hypers.push_back(hypers.back());
      continue;
    }
    const double bc1 = bias_correction ? 1.0 - std::pow(beta1, steps[i]) : 1.0;
    const double bc2 = bias_correction ? 1.0 - std::pow(beta2, steps[i]) : 1.0;
    hypers.push_back({grad_prep(loss_scaling, clip_coef, maximize),
                      static_cast<float>(weight_decay),
                      static_cast<float>(1.0 - lr * weight_decay),
                      static_cast<float>(1.0 - beta1),
                      static_cast<float>(beta2),
                      static_cast<float>(1.0 - beta2),
                      static_cast<float>(std::sqrt(bc2)),
                      static_cast<float>(eps),
                      static_cast<float>(-(lr / bc1)),
                      decoupled_weight_decay});
  }
  for_each_tile_all(all, chunk_elements, true,
                    [&](size_t i, const TileView& v) { adam_tile(hypers[i], v); });
}

void rmsprop_step(
    at::TensorList params, at::TensorList grads, at::TensorList square_avgs,
    at::TensorList momentum_buffers, at::TensorList grad_avgs, double lr, double alpha,
    double eps, double weight_decay, double momentum, bool centered, bool maximize,
    bool use_tf_variant, double loss_scaling, double clip_coef, int64_t chunk_elements) {
  check_common(loss_scaling, clip_coef, chunk_elements);
  const bool has_momentum = momentum > 0.0;
  TORCH_CHECK(has_momentum || momentum_buffers.empty(),
              "momentum_buffers must be empty when momentum is 0, got ",
              momentum_buffers.size());
  TORCH_CHECK(centered || grad_avgs.empty(),
              "grad_avgs must be empty when centered=False, got ", grad_avgs.size());
  std::vector<std::pair<const char*, at::TensorList>> states{{"square_avgs", square_avgs}};
  RmspropHyper h{grad_prep(loss_scaling, clip_coef, maximize),
                 static_cast<float>(-lr),
                 static_cast<float>(alpha),
                 static_cast<float>(1.0 - alpha),
                 static_cast<float>(eps),
                 static_cast<float>(weight_decay),
                 static_cast<float>(momentum),
                 -1,
                 -1,
                 use_tf_variant};
  if (has_momentum) {
    h.mom_slot = static_cast<int>(states.size());
    states.emplace_back("momentum_buffers", momentum_buffers);
  }
  if (centered) {
    h.avg_slot = static_cast<int>(states.size());
    states.emplace_back("grad_avgs", grad_avgs);
  }
  const auto all = gather(params, grads, states);
  count_update("rmsprop_step_", all, 14);
  for_each_tile_all(all, chunk_elements, true,
                    [&](size_t, const TileView& v) { rmsprop_tile(h, v); });
}

namespace {

// Pass 1 of LAMB on one parameter: updates the moments, returns (||w||^2, ||r||^2).
std::pair<double, double> lamb_moments(
    const ParamOperands& ops, LambHyper h, int64_t chunk_elements) {
  const int64_t tiles = (ops.param.numel() + kTile - 1) / kTile;
  std::vector<double> w_sq(tiles, 0.0), r_sq(tiles, 0.0);
  for_each_tile(ops, chunk_elements, true, [&](const TileView& v) {
    float r[kTile];
    LambHyper local = h;
    local.r_out = r;
    lamb_tile(local, v);
    w_sq[v.index] = sum_squares(v.param, v.len);
    r_sq[v.index] = sum_squares(r, v.len);
  });
  double w_total = 0.0, r_total = 0.0;
  for (int64_t t = 0; t < tiles; ++t) {
    w_total += w_sq[t];
    r_total += r_sq[t];
  }
  return {w_total, r_total};
}

}  // namespace

void lamb_step(
    at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs, at::ArrayRef<double> steps, double lr, double beta1,
    double beta2, double eps, double weight_decay, double max_weight_norm,
    bool bias_correction, double loss_scaling, double clip_coef, int64_t chunk_elements) {
  check_common(loss_scaling, clip_coef, chunk_elements);
  const auto all =
      gather(params, grads, {{"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}});
  check_steps(steps, all.size());
  count_update("lamb_step_", all, 24);
  for (size_t i = 0; i < all.size(); ++i) {
    const double bc1 = bias_correction ? 1.0 - std::pow(beta1, steps[i]) : 1.0;
    const double bc2 = bias_correction ? 1.0 - std::pow(beta2, steps[i]) : 1.0;
    LambHyper h{grad_prep(loss_scaling, clip_coef, false),
                static_cast<float>(beta1),
                static_cast<float>(1.0 - beta1),
                static_cast<float>(beta2),
                static_cast<float>(1.0 - beta2),
                static_cast<float>(bc1),
                static_cast<float>(std::sqrt(bc2)),
                static_cast<float>(eps),
                static_cast<float>(weight_decay),
                0.0f,
                true,
                nullptr,
                exp_avgs[i].scalar_type(),
                exp_avg_sqs[i].scalar_type()};
    const auto norms = lamb_moments(all[i], h, chunk_elements);
    const float w_norm = std::min(static_cast<float>(std::sqrt(norms.first)),
                                  static_cast<float>(max_weight_norm));
    const float r_norm = static_cast<float>(std::sqrt(norms.second));
    const bool unit = w_norm == 0.0f || r_norm == 0.0f;
    h.alpha = unit ? static_cast<float>(-lr) : static_cast<float>(-lr) * (w_norm / r_norm);
    h.update_moments = false;
    for_each_tile(all[i], chunk_elements, false, [&](const TileView& v) { lamb_tile(h, v); });
  }
}

std::vector<double> increment_steps(at::TensorList steps) {
  std::vector<double> out(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const at::Tensor& t = steps[i];
    TORCH_CHECK(t.defined() && t.numel() == 1 && t.device().is_cpu(),
                "steps[", i, "] must be a one-element CPU tensor, got ",
                t.defined() ? t.sizes() : at::IntArrayRef{}, " on ",
                t.defined() ? t.device() : at::Device(at::kCPU));
    if (t.scalar_type() == at::kFloat) {
      float* x = t.data_ptr<float>();
      *x += 1.0f;
      out[i] = *x;
    } else {
      t.add_(1);
      out[i] = t.item<double>();
    }
  }
  return out;
}

at::Tensor grad_norm(at::TensorList grads, double loss_scaling) {
  TORCH_CHECK(loss_scaling > 0.0, "loss_scaling must be > 0, got ", loss_scaling);
  const float ls = static_cast<float>(loss_scaling);
  double total = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    check_buffer(g, "grads", static_cast<int64_t>(i), g);
    const at::Tensor gf = g.scalar_type() == at::kFloat ? g : g.to(at::kFloat);
    const float* x = gf.const_data_ptr<float>();
    const int64_t n = gf.numel();
    const int64_t tiles = (n + kTile - 1) / kTile;
    std::vector<double> partial(tiles, 0.0);
    at::parallel_for(0, tiles, 32, [&](int64_t tb, int64_t te) {
      float tmp[kTile];
      for (int64_t t = tb; t < te; ++t) {
        const int64_t lo = t * kTile;
        const int64_t len = std::min(kTile, n - lo);
        for (int64_t j = 0; j < len; ++j) {
          tmp[j] = x[lo + j] / ls;
        }
        partial[t] = sum_squares(tmp, len);
      }
    });
    for (double d : partial) {
      total += d;
    }
  }
  return scalar_tensor(static_cast<float>(std::sqrt(total)), at::kFloat);
}

}  // namespace optim
}  // namespace poptorch_sim

// The steps' schemas and kernels come from their table (optim/ops.h), which module.cpp binds
// as Python functions too.
