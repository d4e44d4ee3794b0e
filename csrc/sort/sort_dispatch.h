// The sorting family on tensors: dtype dispatch (the scalar type and its key codec) and the row
// sort of a tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include "sort/sort.h"

namespace poptorch_sim {
namespace sorting {

// Dtypes the sorting family accepts, for error messages.
const char* supported_dtypes_message();
bool is_supported_dtype(at::ScalarType type);

// Calls `f(scalar_t{}, Codec{})` for the tensor's dtype; see [Note: sort keys].
template <typename F>
void dispatch_sort_type(at::ScalarType type, const char* op, const F& f) {
  switch (type) {
    case at::kFloat:
      return f(float{}, Codec32<float>{});
    case at::kHalf:
      return f(c10::Half{}, Codec32<c10::Half>{});
    case at::kBFloat16:
      return f(c10::BFloat16{}, Codec32<c10::BFloat16>{});
    case at::kInt:
      return f(int32_t{}, Codec32<int32_t>{});
    case at::kShort:
      return f(int16_t{}, Codec32<int16_t>{});
    case at::kChar:
      return f(int8_t{}, Codec32<int8_t>{});
    case at::kByte:
      return f(uint8_t{}, Codec32<uint8_t>{});
    case at::kLong:
      return f(int64_t{}, Codec64<int64_t>{});
    case at::kDouble:
      return f(double{}, Codec64<double>{});
    default:
      TORCH_CHECK(
          false, "poptorch_sim::", op, ": unsupported dtype ", type, "; supported: ",
          supported_dtypes_message());
  }
}

void check_sortable(const at::Tensor& self, const char* op);

// torch.sort over the last dim of a contiguous [rows, n] tensor, into contiguous outputs.
// `values` may be undefined (argsort).
void sort_last_dim(
    const at::Tensor& input, bool descending, at::Tensor values, at::Tensor indices,
    KernelScope& scope);

}  // namespace sorting
}  // namespace poptorch_sim
