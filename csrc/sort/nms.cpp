// poptorch_sim::nms and ::batched_nms: torchvision's contract, on the tile engine.
//
// [Note: blocked NMS]
// Boxes are ordered by score, descending and stable (the tile sort, spread over all tiles), as
// torchvision orders them, then copied into score-ordered columns (x1, y1, x2, y2, area). The
// greedy pass walks that order in blocks of kBlock boxes. Per block: one tile settles the
// block on its own (each surviving box suppresses later boxes of the block); the block's
// keepers are broadcast (exchange) and every tile suppresses its share of the later boxes
// against them (compute); survivors are compacted so later blocks only see live boxes.
// The IoU is the same float expression torchvision evaluates, in the same order, so the kept
// set is identical, not just close: the build uses -ffp-contract=off, and the double threshold
// is turned into the float comparison that decides the same way (see float_threshold).
#include <cmath>
#include <limits>
#include <tuple>
#include <unordered_map>

#include "common/simd.h"
#include "common/tensors.h"
#include "sort/ops.h"
#include "sort/sort.h"
#include "sort/sort_dispatch.h"

namespace poptorch_sim {
namespace nms {
namespace {

using engine::KernelScope;
using engine::split_point;

constexpr int64_t kBlock = 256;
constexpr int64_t kIouFlops = 12;
constexpr int64_t kParallelPairs = 1 << 18;

// For a float ovr: (double)ovr > t exactly when ovr > float_threshold(t).
float float_threshold(double t) {
  float f = static_cast<float>(t);
  if (static_cast<double>(f) > t) {
    f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  }
  return f;
}

template <typename T>
struct Columns {
  std::vector<T> x1, y1, x2, y2, area;
  std::vector<int64_t> index;  // position in the caller's tensor
  void resize(int64_t n) {
    for (auto* column : {&x1, &y1, &x2, &y2, &area}) {
      column->resize(static_cast<size_t>(n));
    }
    index.resize(static_cast<size_t>(n));
  }
};

// suppressed[j] |= IoU(keeper, box j) > threshold for j in [lo, hi), torchvision's arithmetic.
template <typename T>
inline __attribute__((always_inline)) void suppress_range_body(
    const Columns<T>& c, int64_t keeper, T threshold, uint8_t* suppressed, int64_t lo,
    int64_t hi) {
  const T kx1 = c.x1[keeper], ky1 = c.y1[keeper], kx2 = c.x2[keeper], ky2 = c.y2[keeper];
  const T karea = c.area[keeper];
  const T* x1 = c.x1.data();
  const T* y1 = c.y1.data();
  const T* x2 = c.x2.data();
  const T* y2 = c.y2.data();
  const T* area = c.area.data();
  for (int64_t j = lo; j < hi; ++j) {
    const T xx1 = kx1 < x1[j] ? x1[j] : kx1;
    const T yy1 = ky1 < y1[j] ? y1[j] : ky1;
    const T xx2 = x2[j] < kx2 ? x2[j] : kx2;
    const T yy2 = y2[j] < ky2 ? y2[j] : ky2;
    const T dw = xx2 - xx1;
    const T dh = yy2 - yy1;
    const T w = T(0) < dw ? dw : T(0);
    const T h = T(0) < dh ? dh : T(0);
    const T inter = w * h;
    const T ovr = inter / (karea + area[j] - inter);
    suppressed[j] |= static_cast<uint8_t>(ovr > threshold);
  }
}

template <typename T>
POPSIM_AVX512 void suppress_range_avx512(
    const Columns<T>& c, int64_t keeper, T threshold, uint8_t* suppressed, int64_t lo,
    int64_t hi) {
  suppress_range_body(c, keeper, threshold, suppressed, lo, hi);
}

template <typename T>
POPSIM_AVX2 void suppress_range_avx2(
    const Columns<T>& c, int64_t keeper, T threshold, uint8_t* suppressed, int64_t lo,
    int64_t hi) {
  suppress_range_body(c, keeper, threshold, suppressed, lo, hi);
}

template <typename T>
void suppress_range_base(
    const Columns<T>& c, int64_t keeper, T threshold, uint8_t* suppressed, int64_t lo,
    int64_t hi) {
  suppress_range_body(c, keeper, threshold, suppressed, lo, hi);
}

// suppress_range_body compiled for the SIMD level (see [Note: SIMD variants]).
template <typename T>
void suppress_range(
    const Columns<T>& c, int64_t keeper, T threshold, uint8_t* suppressed, int64_t lo,
    int64_t hi) {
  simd::pick(simd::level(simd::Family::kNms), &suppress_range_avx512<T>, &suppress_range_avx2<T>,
             &suppress_range_base<T>)(c, keeper, threshold, suppressed, lo, hi);
}

// Greedy NMS over score-ordered columns; returns kept positions (into the columns), in order.
template <typename T>
std::vector<int64_t> greedy_pass(Columns<T>& c, T threshold, int64_t tiles, KernelScope& scope) {
  int64_t live = static_cast<int64_t>(c.index.size());
  std::vector<uint8_t> suppressed(static_cast<size_t>(live), 0);
  std::vector<int64_t> kept;
  std::vector<int64_t> keepers;
  for (int64_t start = 0; start < live;) {
    const int64_t end = std::min(start + kBlock, live);
    keepers.clear();
    for (int64_t i = start; i < end; ++i) {
      if (!suppressed[i]) {
        keepers.push_back(i);
        suppress_range(c, i, threshold, suppressed.data(), i + 1, end);
      }
    }
    scope.add_flops(kIouFlops * (end - start) * (end - start) / 2);
    const int64_t rest = live - end;
    const int64_t pairs = rest * static_cast<int64_t>(keepers.size());
    const int64_t used = pairs >= kParallelPairs ? tiles : 1;
    scope.add_bytes_exchanged(
        static_cast<int64_t>(keepers.size()) * 5 * static_cast<int64_t>(sizeof(T)) * used);
    scope.add_flops(kIouFlops * pairs);
    scope.superstep(used, [&](int64_t tile) {
      const int64_t lo = end + split_point(rest, used, tile);
      const int64_t hi = end + split_point(rest, used, tile + 1);
      for (int64_t keeper : keepers) {
        suppress_range(c, keeper, threshold, suppressed.data(), lo, hi);
      }
    });
    for (int64_t keeper : keepers) {
      kept.push_back(c.index[keeper]);
    }
    int64_t write = end;
    for (int64_t j = end; j < live; ++j) {
      if (!suppressed[j]) {
        c.x1[write] = c.x1[j];
        c.y1[write] = c.y1[j];
        c.x2[write] = c.x2[j];
        c.y2[write] = c.y2[j];
        c.area[write] = c.area[j];
        c.index[write] = c.index[j];
        suppressed[write] = 0;
        ++write;
      }
    }
    live = write;
    start = end;
  }
  return kept;
}

template <typename T>
auto threshold_for(double iou_threshold) {
  if constexpr (std::is_same<T, float>::value) {
    return float_threshold(iou_threshold);
  } else {
    return iou_threshold;
  }
}

// Order positions by score, descending and stable, over all tiles.
at::Tensor score_order(const at::Tensor& scores, KernelScope& scope) {
  at::Tensor order = empty_tensor({scores.size(0)}, scores.options().dtype(at::kLong));
  sorting::sort_last_dim(scores.contiguous().reshape({1, -1}), true, at::Tensor(),
                         order.reshape({1, -1}), scope);
  return order;
}

// Columns of the boxes at `positions` (in that order), shifted per class by `offsets`.
template <typename T>
void gather_columns(
    const T* boxes, const int64_t* positions, int64_t count, const T* offsets, Columns<T>& c) {
  c.resize(count);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t p = positions[j];
    const T shift = offsets ? offsets[p] : T(0);
    c.x1[j] = offsets ? boxes[p * 4 + 0] + shift : boxes[p * 4 + 0];
    c.y1[j] = offsets ? boxes[p * 4 + 1] + shift : boxes[p * 4 + 1];
    c.x2[j] = offsets ? boxes[p * 4 + 2] + shift : boxes[p * 4 + 2];
    c.y2[j] = offsets ? boxes[p * 4 + 3] + shift : boxes[p * 4 + 3];
    c.area[j] = (c.x2[j] - c.x1[j]) * (c.y2[j] - c.y1[j]);
    c.index[j] = p;
  }
}

at::Tensor to_tensor(const std::vector<int64_t>& kept, const at::Tensor& like) {
  at::Tensor out =
      empty_tensor({static_cast<int64_t>(kept.size())}, like.options().dtype(at::kLong));
  std::copy(kept.begin(), kept.end(), out.mutable_data_ptr<int64_t>());
  return out;
}

void check_boxes(const at::Tensor& boxes, const at::Tensor& scores, const char* op) {
  TORCH_CHECK(
      boxes.device().is_cpu() && scores.device().is_cpu(), "poptorch_sim::", op,
      ": expected CPU tensors, got boxes on ", boxes.device(), " and scores on ",
      scores.device());
  TORCH_CHECK(
      boxes.dim() == 2 && boxes.size(1) == 4, "poptorch_sim::", op,
      ": boxes should be a [N, 4] tensor of (x1, y1, x2, y2), got shape ", boxes.sizes());
  TORCH_CHECK(
      scores.dim() == 1, "poptorch_sim::", op, ": scores should be a 1-D tensor, got shape ",
      scores.sizes());
  TORCH_CHECK(
      boxes.size(0) == scores.size(0), "poptorch_sim::", op,
      ": boxes and scores should have the same number of elements in dimension 0, got ",
      boxes.size(0), " and ", scores.size(0));
  TORCH_CHECK(
      boxes.scalar_type() == scores.scalar_type(), "poptorch_sim::", op,
      ": boxes and scores should have the same dtype, got ", boxes.scalar_type(), " and ",
      scores.scalar_type());
  TORCH_CHECK(
      boxes.scalar_type() == at::kFloat || boxes.scalar_type() == at::kDouble, "poptorch_sim::",
      op, ": boxes should be float32 or float64, got ", boxes.scalar_type());
  TORCH_CHECK(
      !boxes.isnan().any().item<bool>(), "poptorch_sim::", op,
      ": boxes contain NaN coordinates (", boxes.isnan().any(1).sum().item<int64_t>(),
      " of ", boxes.size(0), " boxes); remove or fix them before NMS");
}

template <typename T>
at::Tensor nms_impl(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& offsets,
    double iou_threshold, KernelScope& scope) {
  const int64_t n = boxes.size(0);
  const at::Tensor order = score_order(scores, scope);
  const at::Tensor contiguous = boxes.contiguous();
  Columns<T> columns;
  gather_columns(contiguous.const_data_ptr<T>(), order.const_data_ptr<int64_t>(), n,
                 offsets.defined() ? offsets.const_data_ptr<T>() : nullptr, columns);
  const auto threshold = static_cast<T>(threshold_for<T>(iou_threshold));
  return to_tensor(greedy_pass(columns, threshold, engine::num_tiles(), scope), boxes);
}

}  // namespace

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_boxes(boxes, scores, "nms");
  if (boxes.size(0) == 0) {
    return empty_tensor({0}, boxes.options().dtype(at::kLong));
  }
  KernelScope scope("nms");
  if (boxes.scalar_type() == at::kFloat) {
    return nms_impl<float>(boxes, scores, at::Tensor(), iou_threshold, scope);
  }
  return nms_impl<double>(boxes, scores, at::Tensor(), iou_threshold, scope);
}

namespace {

// Per-class NMS (torchvision's path above 1000 boxes): classes are independent, so each class
// is one task on the tiles; kept boxes come out in global score order.
template <typename T>
at::Tensor per_class_nms(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold, KernelScope& scope) {
  const int64_t n = boxes.size(0);
  const at::Tensor order = score_order(scores, scope);
  const int64_t* ord = order.const_data_ptr<int64_t>();
  const at::Tensor classes = idxs.to(at::kLong).contiguous();
  const int64_t* cls = classes.const_data_ptr<int64_t>();
  std::vector<int64_t> rank(static_cast<size_t>(n));
  std::unordered_map<int64_t, std::vector<int64_t>> groups;
  for (int64_t j = 0; j < n; ++j) {
    rank[ord[j]] = j;
    groups[cls[ord[j]]].push_back(ord[j]);
  }
  std::vector<std::vector<int64_t>*> tasks;
  for (auto& entry : groups) {
    tasks.push_back(&entry.second);
  }
  const at::Tensor contiguous = boxes.contiguous();
  const T* data = contiguous.const_data_ptr<T>();
  const auto threshold = static_cast<T>(threshold_for<T>(iou_threshold));
  const int64_t tiles = engine::num_tiles();
  const auto count = static_cast<int64_t>(tasks.size());
  scope.superstep(std::min(tiles, count), [&](int64_t tile) {
    const int64_t used = std::min(tiles, count);
    for (int64_t t = split_point(count, used, tile); t < split_point(count, used, tile + 1);
         ++t) {
      Columns<T> columns;
      std::vector<int64_t>& group = *tasks[t];
      gather_columns<T>(data, group.data(), static_cast<int64_t>(group.size()), nullptr, columns);
      group = greedy_pass(columns, threshold, count == 1 ? tiles : 1, scope);
    }
  }, n * n / std::max<int64_t>(count, 1));
  std::vector<int64_t> kept;
  for (auto* group : tasks) {
    kept.insert(kept.end(), group->begin(), group->end());
  }
  std::sort(kept.begin(), kept.end(), [&](int64_t a, int64_t b) { return rank[a] < rank[b]; });
  return to_tensor(kept, boxes);
}

}  // namespace

at::Tensor batched_nms_cpu(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  check_boxes(boxes, scores, "batched_nms");
  TORCH_CHECK(
      idxs.device().is_cpu(), "poptorch_sim::batched_nms: expected idxs on the CPU, got ",
      idxs.device());
  TORCH_CHECK(
      idxs.dim() == 1 && idxs.size(0) == boxes.size(0),
      "poptorch_sim::batched_nms: idxs should be a 1-D tensor with one class per box (",
      boxes.size(0), "), got shape ", idxs.sizes());
  TORCH_CHECK(
      at::isIntegralType(idxs.scalar_type(), /*includeBool=*/false),
      "poptorch_sim::batched_nms: idxs should hold integer class ids, got dtype ",
      idxs.scalar_type());
  if (boxes.size(0) == 0) {
    return empty_tensor({0}, boxes.options().dtype(at::kLong));
  }
  KernelScope scope("batched_nms");
  const bool is_float = boxes.scalar_type() == at::kFloat;
  if (boxes.numel() > 4000) {
    return is_float ? per_class_nms<float>(boxes, scores, idxs, iou_threshold, scope)
                    : per_class_nms<double>(boxes, scores, idxs, iou_threshold, scope);
  }
  // torchvision's coordinate trick for small inputs, evaluated in the same arithmetic so the
  // shifted boxes (and so the kept set) match it bit for bit.
  const at::Tensor max_coordinate = boxes.max();
  const at::Tensor offsets = idxs.to(boxes.scalar_type()).mul(max_coordinate.add(1));
  return is_float ? nms_impl<float>(boxes, scores, offsets.contiguous(), iou_threshold, scope)
                  : nms_impl<double>(boxes, scores, offsets.contiguous(), iou_threshold, scope);
}

}  // namespace nms
}  // namespace poptorch_sim
