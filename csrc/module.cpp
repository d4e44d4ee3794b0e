// poptorch_sim._C, the Python module of the C++ kernels.
//
// Loading it registers every op in torch.ops.poptorch_sim (see library.cpp).
// The module itself holds the fused optimizer steps a second time, as Python functions generated
// from their table (see [Note: two calls of one op] in optim/ops.h). The GIL is released while a
// step runs.
// torch's pybind11 casters only: <torch/extension.h> would add the whole C++ frontend (torch/all.h),
// 30 instead of 8 CPU seconds to compile this file.
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "optim/ops.h"

namespace {

// The type a Python function takes for a kernel's parameter of type T: a list becomes a vector
// (the kernels take ArrayRefs, which view it).
template <typename T>
struct PythonArg {
  using type = T;
};
template <>
struct PythonArg<at::TensorList> {
  using type = const std::vector<at::Tensor>&;
};
template <>
struct PythonArg<at::ArrayRef<double>> {
  using type = const std::vector<double>&;
};

// Kernel Fn with the parameter types of PythonArg.
template <auto Fn>
struct PythonFunction;
template <typename R, typename... Args, R (*Fn)(Args...)>
struct PythonFunction<Fn> {
  static R call(typename PythonArg<Args>::type... args) { return Fn(args...); }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace poptorch_sim::optim;
  namespace py = pybind11;
  m.doc() = "poptorch_sim's C++ kernels; the ops are in torch.ops.poptorch_sim";
#define POPSIM_BIND(FN, RELEASE_GIL, SCHEMA)                                         \
  if constexpr (RELEASE_GIL) {                                                       \
    m.def(op_name(SCHEMA).c_str(), &PythonFunction<&FN>::call,                       \
          py::call_guard<py::gil_scoped_release>());                                 \
  } else {                                                                           \
    m.def(op_name(SCHEMA).c_str(), &PythonFunction<&FN>::call);                      \
  }
  POPTORCH_SIM_OPTIM_OPS(POPSIM_BIND)
#undef POPSIM_BIND
}
