// New tensors for the kernels, made by torch's operators out of line (defined in library.cpp):
// the kernels' files include <ATen/core/Tensor.h> only, not the operators' headers. See [Note:
// build time] in setup.py.
#pragma once

#include <ATen/core/Tensor.h>

namespace poptorch_sim {

// at::empty(sizes, options).
at::Tensor empty_tensor(at::IntArrayRef sizes, at::TensorOptions options);

// at::empty_like(like).
at::Tensor empty_tensor_like(const at::Tensor& like);

// at::scalar_tensor(value, dtype).
at::Tensor scalar_tensor(double value, at::ScalarType dtype);

}  // namespace poptorch_sim
