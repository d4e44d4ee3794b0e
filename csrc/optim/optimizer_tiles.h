// The fused optimizers' element loops, one tile at a time, in every SIMD variant.
// See [Note: optimizer tiles] in optimizer.h and [Note: SIMD variants] in common/simd.h.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace poptorch_sim {
namespace optim {

// Torch-free (see [Note: kernels without torch's headers] in setup.py): the tile and its view
// live here, optimizer.h adds the operands as tensors.
constexpr int64_t kTile = 1024;
constexpr int kMaxStates = 3;

// One tile's float views: param, grad and up to kMaxStates optimizer states.
struct TileView {
  float* param;
  const float* grad;
  float* state[kMaxStates];
  int64_t len;    // elements in this tile (<= kTile)
  int64_t index;  // tile index within the parameter
};

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

struct SgdHyper {
  GradPrep gp;
  float neg_lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, first_step;
};

struct AdamHyper {
  GradPrep gp;
  float weight_decay, decay_factor, lerp_w, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
  bool decoupled;
};

struct RmspropHyper {
  GradPrep gp;
  float neg_lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
  int mom_slot, avg_slot;  // state slots of momentum_buffer / grad_avg, -1 when absent
  bool tf_variant;
};

struct LambHyper {
  GradPrep gp;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bc1, bc2_sqrt, eps, weight_decay;
  float alpha;            // -lr * trust ratio (pass 2 only)
  bool update_moments;    // pass 1: update m, v; pass 2: read them
  float* r_out;           // pass 1: the tile's update vector r, for its norm
  at::ScalarType m_dtype, s_dtype;  // storage dtypes of m and v
};

// One tile of each update, in the SIMD variant simd::level() picks.
void sgd_tile(const SgdHyper& h, const TileView& v);
void adam_tile(const AdamHyper& h, const TileView& v);
void rmsprop_tile(const RmspropHyper& h, const TileView& v);
void lamb_tile(const LambHyper& h, const TileView& v);

}  // namespace optim
}  // namespace poptorch_sim
