// Device-iteration output stream for OutputMode.Sum: per replica, the sum over micro-batches.
//
// Micro-batch outputs arrive in [deviceIterations, gradientAccumulation, replicas] order; the
// output for replica r is the elementwise sum of every R-th of them starting at r. The sum is
// accumulated in the dtype's op-math type (float for float16/bfloat16) tile by tile and written
// once, so assembling the output costs exactly one write of it and no intermediate stack.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "common/tensors.h"
#include "engine/ops.h"

namespace poptorch_sim {
namespace streams {
namespace {

constexpr int64_t kTile = 1024;

void check_micro_batches(at::TensorList mbs, int64_t replicas) {
  TORCH_CHECK(!mbs.empty(), "stream_sum: needs at least one micro-batch output");
  TORCH_CHECK(replicas >= 1, "stream_sum: replicas must be >= 1, got ", replicas);
  TORCH_CHECK(static_cast<int64_t>(mbs.size()) % replicas == 0, "stream_sum: ", mbs.size(),
              " micro-batch outputs is not a multiple of replicas=", replicas);
  const at::Tensor& first = mbs[0];
  for (size_t i = 1; i < mbs.size(); ++i) {
    TORCH_CHECK(mbs[i].sizes() == first.sizes(), "stream_sum: micro_batches[", i,
                "] has shape ", mbs[i].sizes(), " but micro_batches[0] has ", first.sizes());
    TORCH_CHECK(mbs[i].scalar_type() == first.scalar_type(), "stream_sum: micro_batches[", i,
                "] has dtype ", mbs[i].scalar_type(), " but micro_batches[0] has ",
                first.scalar_type());
    TORCH_CHECK(mbs[i].device() == first.device(), "stream_sum: micro_batches[", i,
                "] is on ", mbs[i].device(), " but micro_batches[0] is on ", first.device());
  }
}

template <typename T>
void sum_tiles(const std::vector<at::Tensor>& src, T* out, int64_t replicas, int64_t numel) {
  using acc_t = at::opmath_type<T>;
  const int64_t steps = static_cast<int64_t>(src.size()) / replicas;
  const int64_t tiles = (numel + kTile - 1) / kTile;
  at::parallel_for(0, replicas * tiles, 16, [&](int64_t b, int64_t e) {
    acc_t acc[kTile];
    for (int64_t job = b; job < e; ++job) {
      const int64_t r = job / tiles;
      const int64_t lo = (job % tiles) * kTile;
      const int64_t len = std::min(kTile, numel - lo);
      std::fill(acc, acc + len, acc_t(0));
      for (int64_t s = 0; s < steps; ++s) {
        const T* x = src[s * replicas + r].const_data_ptr<T>() + lo;
        for (int64_t i = 0; i < len; ++i) {
          acc[i] += static_cast<acc_t>(x[i]);
        }
      }
      T* y = out + r * numel + lo;
      for (int64_t i = 0; i < len; ++i) {
        y[i] = static_cast<T>(acc[i]);
      }
    }
  });
}

}  // namespace

at::Tensor stream_sum(at::TensorList micro_batches, int64_t replicas) {
  check_micro_batches(micro_batches, replicas);
  std::vector<at::Tensor> src;
  src.reserve(micro_batches.size());
  for (const auto& t : micro_batches) {
    src.push_back(t.contiguous());
  }
  std::vector<int64_t> shape{replicas};
  shape.insert(shape.end(), src[0].sizes().begin(), src[0].sizes().end());
  at::Tensor out = empty_tensor(shape, src[0].options());
  const int64_t numel = src[0].numel();
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(),
                             "stream_sum", [&] {
                               sum_tiles<scalar_t>(src, out.data_ptr<scalar_t>(), replicas,
                                                   numel);
                             });
  return out;
}

}  // namespace streams
}  // namespace poptorch_sim
