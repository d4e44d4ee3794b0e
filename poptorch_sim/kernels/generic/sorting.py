"""Generic sort, argsort, topk, nms and batched_nms: the C++ kernels' contracts in torch ops.

Each function keeps the contract its tile kernel documents (see
:mod:`poptorch_sim.kernels.sorting`): sorts are stable, ``-0.0`` ties with ``0.0``, NaN sorts
as the largest value, top-k keeps the lowest index among equal values and returns sorted
results, and NMS orders equal scores by input position. The results are therefore identical
to the C++ kernels', not just close, on any device whose ``torch.sort(stable=True)`` is stable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["argsort", "batched_nms", "nms", "sort", "topk"]

SORTABLE = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
)  # fmt: skip


def _check_sortable(input: Tensor, op: str) -> None:
    if input.dtype not in SORTABLE:
        names = ", ".join(str(d).removeprefix("torch.") for d in SORTABLE)
        raise RuntimeError(
            f"poptorch_sim::{op}: unsupported dtype {input.dtype}; supported: {names}"
        )


def _keys(input: Tensor) -> Tensor:
    """Sort keys: ``-0.0`` becomes ``+0.0`` so the two tie (some device sorts order them)."""
    return input + 0 if input.is_floating_point() else input


def _sorted_indices(input: Tensor, dim: int, descending: bool) -> Tensor:
    if input.dim() == 0:
        return torch.zeros((), dtype=torch.int64, device=input.device)
    return torch.sort(_keys(input), dim=dim, descending=descending, stable=True).indices


def _gather(input: Tensor, dim: int, indices: Tensor) -> Tensor:
    # The values are input elements (with their own sign of zero), picked by the indices.
    if input.dim() == 0:
        return input.clone()
    return torch.gather(input, dim, indices)


def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """``poptorch_sim::sort``: stable ``(values, indices)`` along ``dim``, both contiguous."""
    _check_sortable(self, "sort")
    indices = _sorted_indices(self, dim, descending).contiguous()
    return _gather(self, dim, indices).contiguous(), indices


def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    """``poptorch_sim::argsort``: the stable sort's int64 indices, contiguous."""
    _check_sortable(self, "argsort")
    return _sorted_indices(self, dim, descending).contiguous()


def topk(
    self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[Tensor, Tensor]:
    """``poptorch_sim::topk``: the first ``k`` of the stable sort (lowest index wins ties).

    ``sorted`` is ignored: results always come out sorted, as from the C++ kernel.
    """
    del sorted
    _check_sortable(self, "topk")
    moved = self.reshape(1) if self.dim() == 0 else self
    n = moved.size(dim)  # raises torch's IndexError for a bad dim
    wrapped = dim % moved.dim()
    if not 0 <= k <= n:
        raise RuntimeError(
            f"poptorch_sim::topk: selected index k out of range: k={k} but dimension "
            f"{wrapped} has size {n} (k must be in [0, {n}])"
        )
    indices = _sorted_indices(moved, dim, largest).narrow(dim, 0, k).contiguous()
    values = torch.gather(moved, dim, indices).contiguous()
    if self.dim() == 0 and k == 1:
        return values.reshape(()), indices.reshape(())
    return values, indices


def _check_boxes(boxes: Tensor, scores: Tensor, op: str) -> None:
    where = f"poptorch_sim::{op}"
    if boxes.dim() != 2 or boxes.size(1) != 4:
        raise RuntimeError(
            f"{where}: boxes should be a [N, 4] tensor of (x1, y1, x2, y2), got shape "
            f"{list(boxes.shape)}"
        )
    if scores.dim() != 1:
        raise RuntimeError(
            f"{where}: scores should be a 1-D tensor, got shape {list(scores.shape)}"
        )
    if boxes.size(0) != scores.size(0):
        raise RuntimeError(
            f"{where}: boxes and scores should have the same number of elements in dimension "
            f"0, got {boxes.size(0)} and {scores.size(0)}"
        )
    if boxes.dtype != scores.dtype:
        raise RuntimeError(
            f"{where}: boxes and scores should have the same dtype, got {boxes.dtype} and "
            f"{scores.dtype}"
        )
    if boxes.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{where}: boxes should be float32 or float64, got {boxes.dtype}")
    if boxes.device != scores.device:
        raise RuntimeError(
            f"{where}: boxes are on {boxes.device} but scores on {scores.device}; put both on "
            "one device"
        )
    bad = torch.isnan(boxes).any(1)
    if bool(bad.any()):
        raise RuntimeError(
            f"{where}: boxes contain NaN coordinates ({int(bad.sum())} of {boxes.size(0)} "
            "boxes); remove or fix them before NMS"
        )


def _score_order(scores: Tensor) -> tuple[Tensor, Tensor]:
    """Positions by decreasing score (stable), and strictly decreasing stand-in scores.

    torchvision's kernels sort the scores themselves; handing them already-ordered boxes with
    distinct decreasing scores makes their order (and so the kept set) independent of whether
    that device's sort is stable, so equal scores keep their input order everywhere.
    """
    order = torch.sort(scores, descending=True, stable=True).indices
    ranks = torch.arange(scores.numel(), 0, -1, dtype=scores.dtype, device=scores.device)
    return order, ranks


def _threshold(boxes: Tensor, iou_threshold: float) -> float:
    """The threshold that decides ``float IoU > iou_threshold`` alike on every device.

    For float32 boxes the IoU is a float; torchvision's CPU kernel compares it with the double
    threshold, its CUDA kernel with the threshold rounded to float. The largest float not above
    the threshold decides exactly as the double comparison does, in both (the C++ kernel's
    ``float_threshold``).
    """
    t = float(iou_threshold)
    if boxes.dtype != torch.float32:
        return t
    f = torch.tensor(t, dtype=torch.float32)
    if float(f) > t:
        f = torch.nextafter(f, torch.tensor(-math.inf, dtype=torch.float32))
    return float(f)


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """``poptorch_sim::nms``: :func:`torchvision.ops.nms` with stable score order."""
    import torchvision

    _check_boxes(boxes, scores, "nms")
    if boxes.size(0) == 0:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    order, ranks = _score_order(scores)
    kept = torchvision.ops.nms(boxes[order], ranks, _threshold(boxes, iou_threshold))
    return order[kept]


def _per_class_nms(boxes: Tensor, ranks: Tensor, classes: Tensor, threshold: float) -> Tensor:
    """One NMS per category; kept positions in score order (positions are ranks here)."""
    import torchvision

    kept = []
    for category in torch.unique(classes):
        members = torch.nonzero(classes == category).flatten()
        kept.append(members[torchvision.ops.nms(boxes[members], ranks[members], threshold)])
    return torch.sort(torch.cat(kept)).values


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """``poptorch_sim::batched_nms``: :func:`torchvision.ops.batched_nms`'s contract.

    Above 4000 coordinates one NMS per category, else torchvision's coordinate-offset trick in
    its arithmetic, as the C++ kernel (and torchvision on the CPU) decide; torchvision itself
    moves that limit to 20000 on CUDA, which could change the kept set, so both paths are
    spelled out here.
    """
    import torchvision

    _check_boxes(boxes, scores, "batched_nms")
    if idxs.dim() != 1 or idxs.size(0) != boxes.size(0):
        raise RuntimeError(
            f"poptorch_sim::batched_nms: idxs should be a 1-D tensor with one class per box "
            f"({boxes.size(0)}), got shape {list(idxs.shape)}"
        )
    if idxs.is_floating_point() or idxs.is_complex() or idxs.dtype == torch.bool:
        raise RuntimeError(
            f"poptorch_sim::batched_nms: idxs should hold integer class ids, got dtype "
            f"{idxs.dtype}"
        )
    if boxes.size(0) == 0:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    order, ranks = _score_order(scores)
    ordered, classes = boxes[order], idxs.to(boxes.device)[order]
    threshold = _threshold(boxes, iou_threshold)
    if boxes.numel() > 4000:
        return order[_per_class_nms(ordered, ranks, classes, threshold)]
    offsets = classes.to(boxes.dtype) * (boxes.max() + 1)
    return order[torchvision.ops.nms(ordered + offsets[:, None], ranks, threshold)]
