// Shared pieces of the optimizer tile kernels: operands, tiles, SIMD dispatch, off-chip streaming.
//
// [Note: optimizer tiles]
// Every fused update walks its flat buffers in tiles of kTile elements. A tile is the unit of
// dtype conversion (fp16 operands are widened into fp32 scratch, updated, and narrowed back)
// and of reduction: a norm is the in-order sum of one double partial per tile, each partial
// summed over 8 fixed lanes. Tiles start at multiples of kTile of the parameter's own index,
// so the numbers do not depend on the thread count, on the pointer alignment, or on how
// off-chip state is chunked (chunks are whole tiles). Threads claim work in units of 16
// tiles from the tile engine's pool; on-chip, one loop runs the tiles of all parameters of a
// call together (a unit may span several small parameters), so a step over thousands of
// small parameters costs one parallel loop, not one per parameter.
//
// The element loops are plain C++ compiled once per SIMD level (see [Note: SIMD variants] in
// common/simd.h), picked at run time. Where ATen's vectorised kernels fuse a multiply-add
// (`add(x, y, alpha)`, `lerp`) the loops call fmaf explicitly, so the numbers follow
// torch.optim's closely; a variant is deterministic per element, independent of the element's
// position in a tile or chunk.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "optim/optimizer_tiles.h"

namespace poptorch_sim {
namespace optim {

// Runs `fn(view)` for tiles [tile_begin, tile_end) of one parameter. States come from
// `state_base` pointers (one per state, raw data of dtype `state_dtypes[s]`) whose element 0
// corresponds to parameter element `state_offset`.
using TileFn = std::function<void(const TileView&)>;

struct ParamOperands {
  at::Tensor param;
  at::Tensor grad;
  std::vector<at::Tensor> states;
};

// Runs `fn` on every tile of elements [begin, end) of `ops`, with state storage taken from
// `state_ptrs` (raw pointers whose element 0 is parameter element `state_origin`). Parallel
// over tiles. `begin` must be a multiple of kTile.
void run_tiles(
    const ParamOperands& ops,
    const std::vector<void*>& state_ptrs,
    int64_t state_origin,
    int64_t begin,
    int64_t end,
    const TileFn& fn);

// Runs `fn` over all tiles of `ops`: directly on the state tensors when `chunk_elements` is 0,
// otherwise streaming each state through a staging buffer of `chunk_elements` elements per
// state (see [Note: off-chip optimizer state] in offload.cpp). `write_back` is false for passes
// that only read the state.
void for_each_tile(
    const ParamOperands& ops,
    int64_t chunk_elements,
    bool write_back,
    const TileFn& fn);

// `fn(i, view)` for every tile of every parameter `all[i]`. On-chip (`chunk_elements` 0) the
// tiles of all parameters form one parallel loop, so many small parameters cost no more than
// one large one; off-chip, `for_each_tile` per parameter. Each tile meets the same arithmetic
// either way.
using IndexedTileFn = std::function<void(size_t, const TileView&)>;
void for_each_tile_all(
    const std::vector<ParamOperands>& all,
    int64_t chunk_elements,
    bool write_back,
    const IndexedTileFn& fn);

// Sum of squares of `x[0:n)` over 8 fixed lanes, in double; see [Note: optimizer tiles].
double sum_squares(const float* x, int64_t n);

// The fused updates (schemas: optim/ops.h; semantics: optimizer.cpp). Also bound directly as
// Python functions (module.cpp), whose argument conversion costs less per tensor than the
// dispatcher's for lists of thousands of parameters.
void sgd_step(
    at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr,
    double momentum, double dampening, double weight_decay, bool nesterov, bool maximize,
    bool first_step, double loss_scaling, double clip_coef, int64_t chunk_elements);
void adam_step(
    at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs, at::ArrayRef<double> steps, double lr, double beta1,
    double beta2, double eps, double weight_decay, bool decoupled_weight_decay,
    bool bias_correction, bool maximize, double loss_scaling, double clip_coef,
    int64_t chunk_elements);
void rmsprop_step(
    at::TensorList params, at::TensorList grads, at::TensorList square_avgs,
    at::TensorList momentum_buffers, at::TensorList grad_avgs, double lr, double alpha,
    double eps, double weight_decay, double momentum, bool centered, bool maximize,
    bool use_tf_variant, double loss_scaling, double clip_coef, int64_t chunk_elements);
void lamb_step(
    at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
    at::TensorList exp_avg_sqs, at::ArrayRef<double> steps, double lr, double beta1,
    double beta2, double eps, double weight_decay, double max_weight_norm,
    bool bias_correction, double loss_scaling, double clip_coef, int64_t chunk_elements);
// Adds 1 to each one-element `steps` tensor in place; returns the new values.
std::vector<double> increment_steps(at::TensorList steps);


}  // namespace optim
}  // namespace poptorch_sim
