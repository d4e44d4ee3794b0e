// Python bindings of the fused optimizer updates, for FusedOptimizer's eager step.
//
// The same functions are dispatcher ops (torch.ops.poptorch_sim.*_step_), which is what
// torch.compile, fake tensors and opcheck see. Calling an op from Python converts every tensor
// of every list through the JIT's schema matching, about a microsecond per tensor: with
// thousands of parameters and four lists that is milliseconds per step, more than the update
// of the small parameters itself. pybind11's conversion of the same lists costs a few percent
// of that. The GIL is released while the update runs.
#include <torch/extension.h>

#include "optim/optimizer.h"

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace poptorch_sim::optim;
  m.doc() = "poptorch_sim's C++ kernels; the ops are in torch.ops.poptorch_sim";
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("sgd_step_", [](const std::vector<at::Tensor>& params,
                        const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& momentum_buffers, double lr,
                        double momentum, double dampening, double weight_decay, bool nesterov,
                        bool maximize, bool first_step, double loss_scaling, double clip_coef,
                        int64_t chunk_elements) {
    sgd_step(params, grads, momentum_buffers, lr, momentum, dampening, weight_decay, nesterov,
             maximize, first_step, loss_scaling, clip_coef, chunk_elements);
  }, nogil);
  m.def("adam_step_", [](const std::vector<at::Tensor>& params,
                         const std::vector<at::Tensor>& grads,
                         const std::vector<at::Tensor>& exp_avgs,
                         const std::vector<at::Tensor>& exp_avg_sqs,
                         const std::vector<double>& steps, double lr, double beta1,
                         double beta2, double eps, double weight_decay,
                         bool decoupled_weight_decay, bool bias_correction, bool maximize,
                         double loss_scaling, double clip_coef, int64_t chunk_elements) {
    adam_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
              decoupled_weight_decay, bias_correction, maximize, loss_scaling, clip_coef,
              chunk_elements);
  }, nogil);
  m.def("rmsprop_step_", [](const std::vector<at::Tensor>& params,
                            const std::vector<at::Tensor>& grads,
                            const std::vector<at::Tensor>& square_avgs,
                            const std::vector<at::Tensor>& momentum_buffers,
                            const std::vector<at::Tensor>& grad_avgs, double lr, double alpha,
                            double eps, double weight_decay, double momentum, bool centered,
                            bool maximize, bool use_tf_variant, double loss_scaling,
                            double clip_coef, int64_t chunk_elements) {
    rmsprop_step(params, grads, square_avgs, momentum_buffers, grad_avgs, lr, alpha, eps,
                 weight_decay, momentum, centered, maximize, use_tf_variant, loss_scaling,
                 clip_coef, chunk_elements);
  }, nogil);
  m.def("lamb_step_", [](const std::vector<at::Tensor>& params,
                         const std::vector<at::Tensor>& grads,
                         const std::vector<at::Tensor>& exp_avgs,
                         const std::vector<at::Tensor>& exp_avg_sqs,
                         const std::vector<double>& steps, double lr, double beta1,
                         double beta2, double eps, double weight_decay, double max_weight_norm,
                         bool bias_correction, double loss_scaling, double clip_coef,
                         int64_t chunk_elements) {
    lamb_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
              max_weight_norm, bias_correction, loss_scaling, clip_coef, chunk_elements);
  }, nogil);
  m.def("increment_steps_", [](const std::vector<at::Tensor>& steps) {
    return increment_steps(steps);
  });
}
