// In-place gradient accumulation over flat buffers: accum += grad * scale.
//
// The runtime accumulates each micro-batch's gradients into per-parameter accumulators whose
// dtype is the optimizer's `accum_type` (float32 or float16). Mean/Sum reduction over
// accumulation steps and replicas is expressed by `scale` (1/(GA*R) or 1). Arithmetic is in
// float32 and rounded once into the accumulator. The op returns nothing (a returned alias of
// `accum` would keep torch.compile from functionalising it); the Python wrapper returns accum.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "common/simd.h"
#include "engine/tile_engine.h"
#include "optim/ops.h"
#include "optim/optimizer.h"

namespace poptorch_sim {
namespace accumulate {
namespace {

constexpr int64_t kTile = optim::kTile;

inline __attribute__((always_inline)) void axpy_body(
    float* acc, const float* g, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    acc[i] = acc[i] + scale * g[i];
  }
}
POPSIM_AVX512 void axpy_avx512(float* acc, const float* g, float s, int64_t n) {
  axpy_body(acc, g, s, n);
}
POPSIM_AVX2 void axpy_avx2(float* acc, const float* g, float s, int64_t n) {
  axpy_body(acc, g, s, n);
}
void axpy_base(float* acc, const float* g, float s, int64_t n) { axpy_body(acc, g, s, n); }


template <typename T>
void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

template <typename T>
void from_float(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<T>(src[i]);
  }
}

// Float view of tile [lo, lo+len) of `t`: the data for float32, a widened copy otherwise.
float* view_tile(const at::Tensor& t, int64_t lo, int64_t len, float* scratch) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return const_cast<float*>(t.const_data_ptr<float>()) + lo;
    case at::kHalf:
      to_float(t.const_data_ptr<at::Half>() + lo, scratch, len);
      return scratch;
    default:
      to_float(t.const_data_ptr<at::BFloat16>() + lo, scratch, len);
      return scratch;
  }
}

void store_tile(at::Tensor& t, int64_t lo, int64_t len, const float* scratch) {
  if (t.scalar_type() == at::kHalf) {
    from_float(scratch, t.data_ptr<at::Half>() + lo, len);
  } else if (t.scalar_type() == at::kBFloat16) {
    from_float(scratch, t.data_ptr<at::BFloat16>() + lo, len);
  }
}

void check_pair(const at::Tensor& accum, const at::Tensor& grad, const std::string& where) {
  const auto ok = [](at::ScalarType t) {
    return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
  };
  TORCH_CHECK(ok(accum.scalar_type()), "accumulate_: accum", where,
              " must be float32, float16 or bfloat16, got ", accum.scalar_type());
  TORCH_CHECK(ok(grad.scalar_type()), "accumulate_: grad", where,
              " must be float32, float16 or bfloat16, got ", grad.scalar_type());
  TORCH_CHECK(accum.device() == grad.device(), "accumulate_: accum", where, " is on ",
              accum.device(), " but grad", where, " is on ", grad.device());
  TORCH_CHECK(accum.device().is_cpu(), "accumulate_: expected CPU tensors, got ",
              accum.device());
  TORCH_CHECK(accum.numel() == grad.numel(), "accumulate_: accum", where, " has ",
              accum.numel(), " elements (shape ", accum.sizes(), ") but grad", where, " has ",
              grad.numel(), " (shape ", grad.sizes(), ")");
  TORCH_CHECK(accum.is_contiguous(), "accumulate_: accum", where,
              " must be contiguous (a flat buffer)");
}

void accumulate_into(at::Tensor& accum, const at::Tensor& grad_in, double scale) {
  const at::Tensor grad = grad_in.contiguous();
  const int64_t n = accum.numel();
  engine::KernelScope scope("accumulate_");
  scope.add_supersteps(1);
  scope.add_flops(2 * n);
  const float s = static_cast<float>(scale);
  const auto axpy = simd::pick(simd::level(simd::Family::kAccumulate), &axpy_avx512, &axpy_avx2, &axpy_base);
  const int64_t tiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 64, [&](int64_t tb, int64_t te) {
    float abuf[kTile], gbuf[kTile];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t lo = t * kTile;
      const int64_t len = std::min(kTile, n - lo);
      float* a = view_tile(accum, lo, len, abuf);
      const float* g = view_tile(grad, lo, len, gbuf);
      axpy(a, g, s, len);
      store_tile(accum, lo, len, abuf);
    }
  });
}

}  // namespace

void accumulate_(at::Tensor& accum, const at::Tensor& grad, double scale) {
  check_pair(accum, grad, "");
  accumulate_into(accum, grad, scale);
}

void accumulate_many_(at::TensorList accums, at::TensorList grads, double scale) {
  TORCH_CHECK(accums.size() == grads.size(),
              "accumulate_many_: accums and grads must have the same length, got ",
              accums.size(), " and ", grads.size());
  for (size_t i = 0; i < accums.size(); ++i) {
    check_pair(accums[i], grads[i], "[" + std::to_string(i) + "]");
  }
  for (size_t i = 0; i < accums.size(); ++i) {
    at::Tensor a = accums[i];
    accumulate_into(a, grads[i], scale);
  }
}

}  // namespace accumulate
}  // namespace poptorch_sim
