// The sorting family's ops: torch.sort, argsort and topk, torchvision's nms and batched_nms, and
// the 8-lane network's test hook. Their schemas are registered in library.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace poptorch_sim {
namespace sorting {

// sort.cpp
std::tuple<at::Tensor, at::Tensor> sort_cpu(const at::Tensor& self, int64_t dim, bool descending);
at::Tensor argsort_cpu(const at::Tensor& self, int64_t dim, bool descending);
std::tuple<at::Tensor, at::Tensor> sort_rows_8_lanes(const at::Tensor& self, bool descending);
bool sort_rows_8_lanes_built();

// topk.cpp
std::tuple<at::Tensor, at::Tensor> topk_cpu(
    const at::Tensor& self, int64_t k, int64_t dim, bool largest, bool sorted);

}  // namespace sorting

namespace nms {

// nms.cpp
at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);
at::Tensor batched_nms_cpu(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold);

}  // namespace nms
}  // namespace poptorch_sim
