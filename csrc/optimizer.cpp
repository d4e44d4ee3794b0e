// Fused optimizer updates (SGD, Adam/AdamW, RMSprop, LAMB) over lists of flat parameter buffers.
//
// Each op updates params and states in place, one pass over memory per parameter (LAMB: two,
// its trust ratio needs two norms first). Gradients arrive multiplied by the loss scale and are
// divided by it, then multiplied by the clip coefficient, exactly as
// `p.grad /= loss_scaling; clip_grad_norm_(...); opt.step()` would; the element formulas and
// their operation order follow torch/optim/*.py (`foreach=False`). See [Note: optimizer tiles].
#include "optimizer.h"
#include "simd.h"
#include "tile_engine.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace poptorch_sim {
namespace optim {
namespace {

#define POPSIM_INLINE inline __attribute__((always_inline))

// In-place square root of a tile. Written with intrinsics because the compiler keeps `sqrtf`
// scalar (errno) without -fno-math-errno; IEEE square roots are correctly rounded, so both
// variants give identical bits.
struct SqrtBase {
  static POPSIM_INLINE void run(float* x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
    }
    for (; i < n; ++i) {
      _mm_store_ss(x + i, _mm_sqrt_ss(_mm_load_ss(x + i)));
    }
  }
};

struct SqrtAvx2 {
  POPSIM_AVX2 static void run(float* x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
    }
    for (; i < n; ++i) {
      _mm_store_ss(x + i, _mm_sqrt_ss(_mm_load_ss(x + i)));
    }
  }
};

struct SqrtAvx512 {
  POPSIM_AVX512 static void run(float* x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
    }
    for (; i < n; ++i) {
      _mm_store_ss(x + i, _mm_sqrt_ss(_mm_load_ss(x + i)));
    }
  }
};

// Defines NAME(h, v) that runs NAME##_body compiled for the SIMD level (see [Note: SIMD
// variants]), with the gradient unscaled by a division or by an exact reciprocal (see GradPrep).
#define POPSIM_SIMD_VARIANT(NAME, HYPER, SUFFIX, ATTRIBUTE, SQRT)                       \
  ATTRIBUTE void NAME##SUFFIX(const HYPER& h, const TileView& v) {                      \
    if (h.gp.by_inverse) {                                                              \
      NAME##_body<SQRT, true>(h, v);                                                    \
    } else {                                                                            \
      NAME##_body<SQRT, false>(h, v);                                                   \
    }                                                                                   \
  }
#define POPSIM_SIMD_DISPATCH(NAME, HYPER)                                               \
  POPSIM_SIMD_VARIANT(NAME, HYPER, _avx512, POPSIM_AVX512, SqrtAvx512)                  \
  POPSIM_SIMD_VARIANT(NAME, HYPER, _avx2, POPSIM_AVX2, SqrtAvx2)                        \
  POPSIM_SIMD_VARIANT(NAME, HYPER, _base, , SqrtBase)                                   \
  void NAME(const HYPER& h, const TileView& v) {                                        \
    switch (simd::level()) {                                                            \
      case simd::Level::kAvx512:                                                        \
        return NAME##_avx512(h, v);                                                     \
      case simd::Level::kAvx2:                                                          \
        return NAME##_avx2(h, v);                                                       \
      default:                                                                          \
        return NAME##_base(h, v);                                                       \
    }                                                                                   \
  }

// The gradient as the update sees it: unscaled, clipped, negated when maximising. When the loss
// scaling is a power of two with a normal reciprocal, `g * (1 / ls)` and `g / ls` are the same
// correctly rounded number, and the multiplication spares the update one of its divisions.
struct GradPrep {
  float loss_scaling;
  float inverse;  // 1 / loss_scaling, exact when by_inverse
  float clip_coef;
  bool maximize;
  bool by_inverse;
};

template <bool kByInverse>
POPSIM_INLINE float prep(const GradPrep& gp, float g) {
  g = kByInverse ? g * gp.inverse : g / gp.loss_scaling;
  g = g * gp.clip_coef;
  return gp.maximize ? -g : g;
}

// `other * alpha + self` with one rounding, as ATen's vectorised `add(self, other, alpha)`.
POPSIM_INLINE float add_alpha(float self, float other, float alpha) {
  return __builtin_fmaf(other, alpha, self);
}

// ATen's vectorised lerp: fma(w or w - 1, end - self, self or end), by |w| < 0.5.
POPSIM_INLINE float lerp(float self, float end, float w) {
  const bool small = __builtin_fabsf(w) < 0.5f;
  return __builtin_fmaf(small ? w : w - 1.0f, end - self, small ? self : end);
}

// ---------------------------------------------------------------- SGD

struct SgdHyper {
  GradPrep gp;
  float neg_lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, first_step;
};

template <class Sqrt, bool kByInverse>
POPSIM_INLINE void sgd_tile_body(const SgdHyper h, const TileView v) {
  float* p = v.param;
  float* buf = v.state[0];
  const bool has_wd = h.weight_decay != 0.0f;
  for (int64_t i = 0; i < v.len; ++i) {
    float g = prep<kByInverse>(h.gp, v.grad[i]);
    if (has_wd) {
      g = add_alpha(g, p[i], h.weight_decay);
    }
    if (buf != nullptr) {
      const float b =
          h.first_step ? g : add_alpha(buf[i] * h.momentum, g, h.one_minus_dampening);
      buf[i] = b;
      g = h.nesterov ? add_alpha(g, b, h.momentum) : b;
    }
    p[i] = add_alpha(p[i], g, h.neg_lr);
  }
}
POPSIM_SIMD_DISPATCH(sgd_tile, SgdHyper)

// ---------------------------------------------------------------- Adam / AdamW

constexpr int64_t kAdamBlock = 64;

struct AdamHyper {
  GradPrep gp;
  float weight_decay, decay_factor, lerp_w, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
  bool decoupled;
};

template <class Sqrt, bool kByInverse>
POPSIM_INLINE void adam_tile_body(const AdamHyper h, const TileView v) {
  // Blocks of kAdamBlock elements: the square roots and divisions of one block overlap the
  // loads of the next, where a whole-tile pass of each would leave memory idle meanwhile.
  const bool has_wd = h.weight_decay != 0.0f;
  for (int64_t b = 0; b < v.len; b += kAdamBlock) {
    const int64_t len = std::min(kAdamBlock, v.len - b);
    float* __restrict p = v.param + b;
    float* __restrict m = v.state[0] + b;
    float* __restrict s = v.state[1] + b;
    const float* __restrict grad = v.grad + b;
    float root[kAdamBlock];
    for (int64_t i = 0; i < len; ++i) {
      float g = prep<kByInverse>(h.gp, grad[i]);
      float w = p[i];
      if (has_wd) {
        if (h.decoupled) {
          w = w * h.decay_factor;
        } else {
          g = add_alpha(g, w, h.weight_decay);
        }
      }
      m[i] = lerp(m[i], g, h.lerp_w);
      float si = s[i] * h.beta2;
      si = si + h.one_minus_beta2 * g * g;
      s[i] = si;
      p[i] = w;
      root[i] = si;
    }
    Sqrt::run(root, len);
    for (int64_t i = 0; i < len; ++i) {
      const float denom = root[i] / h.bc2_sqrt + h.eps;
      p[i] = p[i] + h.neg_step * (m[i] / denom);
    }
  }
}
POPSIM_SIMD_DISPATCH(adam_tile, AdamHyper)

// ---------------------------------------------------------------- RMSprop

struct RmspropHyper {
  GradPrep gp;
  float neg_lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
  int mom_slot, avg_slot;  // state slots of momentum_buffer / grad_avg, -1 when absent
  bool tf_variant;
};

template <class Sqrt, bool kByInverse>
POPSIM_INLINE void rmsprop_tile_body(const RmspropHyper h, const TileView v) {
  float* p = v.param;
  float* sq = v.state[0];
  float* buf = h.mom_slot >= 0 ? v.state[h.mom_slot] : nullptr;
  float* ga = h.avg_slot >= 0 ? v.state[h.avg_slot] : nullptr;
  float root[kTile], grad[kTile];
  const bool has_wd = h.weight_decay != 0.0f;
  for (int64_t i = 0; i < v.len; ++i) {
    float g = prep<kByInverse>(h.gp, v.grad[i]);
    if (has_wd) {
      g = add_alpha(g, p[i], h.weight_decay);
    }
    float sqi = sq[i] * h.alpha;
    sqi = sqi + h.one_minus_alpha * g * g;
    sq[i] = sqi;
    float var = sqi;
    if (ga != nullptr) {
      const float gai = lerp(ga[i], g, h.one_minus_alpha);
      ga[i] = gai;
      var = sqi + -1.0f * gai * gai;
    }
    root[i] = h.tf_variant ? var + h.eps : var;
    grad[i] = g;
  }
  Sqrt::run(root, v.len);
  for (int64_t i = 0; i < v.len; ++i) {
    const float avg = h.tf_variant ? root[i] : root[i] + h.eps;
    if (buf != nullptr) {
      const float b = buf[i] * h.momentum + grad[i] / avg;
      buf[i] = b;
      p[i] = add_alpha(p[i], b, h.neg_lr);
    } else {
      p[i] = p[i] + h.neg_lr * (grad[i] / avg);
    }
  }
}
POPSIM_SIMD_DISPATCH(rmsprop_tile, RmspropHyper)

// ---------------------------------------------------------------- LAMB

struct LambHyper {
  GradPrep gp;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, bc2_sqrt, eps, weight_decay;
  float alpha;            // -lr * trust ratio (pass 2 only)
  bool update_moments;    // pass 1: update m, v; pass 2: read them
  float* r_out;           // pass 1: the tile's update vector r, for its norm
  at::ScalarType m_dtype, s_dtype;  // storage dtypes of m and v
};

// `x` rounded to storage dtype `dt` and widened back: pass 1 must see the moments exactly as
// pass 2 will read them from float16/bfloat16 storage, or the trust ratio would not fit r.
POPSIM_INLINE float stored(float x, at::ScalarType dt) {
  if (dt == at::kHalf) {
    return static_cast<float>(static_cast<at::Half>(x));
  }
  if (dt == at::kBFloat16) {
    return static_cast<float>(static_cast<at::BFloat16>(x));
  }
  return x;
}

template <class Sqrt, bool kByInverse>
POPSIM_INLINE void lamb_tile_body(const LambHyper h, const TileView v) {
  float* p = v.param;
  float* m = v.state[0];
  float* s = v.state[1];
  float root[kTile];
  for (int64_t i = 0; i < v.len; ++i) {
    float si = s[i];
    if (h.update_moments) {
      const float g = prep<kByInverse>(h.gp, v.grad[i]);
      float mi = m[i] * h.beta1;
      m[i] = stored(add_alpha(mi, g, h.one_minus_beta1), h.m_dtype);
      si = si * h.beta2;
      si = stored(si + h.one_minus_beta2 * g * g, h.s_dtype);
      s[i] = si;
    }
    root[i] = si;
  }
  Sqrt::run(root, v.len);
  for (int64_t i = 0; i < v.len; ++i) {
    const float denom = root[i] / h.bc2_sqrt + h.eps;
    const float r = (m[i] / h.bc1) / denom + h.weight_decay * p[i];
    if (h.update_moments) {
      h.r_out[i] = r;
    } else {
      p[i] = add_alpha(p[i], r, h.alpha);
    }
  }
}
POPSIM_SIMD_DISPATCH(lamb_tile, LambHyper)

// ---------------------------------------------------------------- reductions

POPSIM_INLINE double sum_squares_body(const float* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const double d = x[i + l];
      acc[l] += d * d;
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    const double d = x[i];
    acc[l] += d * d;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

POPSIM_AVX512 double sum_squares_avx512(const float* x, int64_t n) {
  return sum_squares_body(x, n);
}
POPSIM_AVX2 double sum_squares_avx2(const float* x, int64_t n) { return sum_squares_body(x, n); }
double sum_squares_base(const float* x, int64_t n) { return sum_squares_body(x, n); }

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
  return at::scalar_tensor(static_cast<float>(std::sqrt(total)), at::kFloat);
}

double sum_squares(const float* x, int64_t n) {
  switch (simd::level()) {
    case simd::Level::kAvx512:
      return sum_squares_avx512(x, n);
    case simd::Level::kAvx2:
      return sum_squares_avx2(x, n);
    default:
      return sum_squares_base(x, n);
  }
}

}  // namespace optim
}  // namespace poptorch_sim

TORCH_LIBRARY_FRAGMENT(poptorch_sim, m) {
  m.def(
      "sgd_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, *, "
      "float lr, float momentum, float dampening, float weight_decay, bool nesterov, "
      "bool maximize, bool first_step, float loss_scaling, float clip_coef, "
      "int chunk_elements) -> ()");
  m.def(
      "adam_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, float[] steps, *, float lr, float beta1, float beta2, "
      "float eps, float weight_decay, bool decoupled_weight_decay, bool bias_correction, "
      "bool maximize, float loss_scaling, float clip_coef, int chunk_elements) -> ()");
  m.def(
      "rmsprop_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] square_avgs, "
      "Tensor(c!)[] momentum_buffers, Tensor(d!)[] grad_avgs, *, float lr, float alpha, "
      "float eps, float weight_decay, float momentum, bool centered, bool maximize, "
      "bool use_tf_variant, float loss_scaling, float clip_coef, int chunk_elements) -> ()");
  m.def(
      "lamb_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, float[] steps, *, float lr, float beta1, float beta2, "
      "float eps, float weight_decay, float max_weight_norm, bool bias_correction, "
      "float loss_scaling, float clip_coef, int chunk_elements) -> ()");
  m.def("grad_norm(Tensor[] grads, float loss_scaling) -> Tensor");
  m.def("increment_steps_(Tensor(a!)[] steps) -> float[]");
}

TORCH_LIBRARY_IMPL(poptorch_sim, CPU, m) {
  using namespace poptorch_sim::optim;
  m.impl("sgd_step_", &sgd_step);
  m.impl("adam_step_", &adam_step);
  m.impl("rmsprop_step_", &rmsprop_step);
  m.impl("lamb_step_", &lamb_step);
  m.impl("grad_norm", &grad_norm);
  m.impl("increment_steps_", &increment_steps);
}
