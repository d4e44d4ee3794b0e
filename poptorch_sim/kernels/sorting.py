"""Typed wrappers of the tile-engine sorting family: sort, argsort, topk, nms, batched_nms.

The C++ kernels (``csrc/sort/``: ``sort.cpp``, ``topk.cpp``, ``nms.cpp``) split each row over the
engine's tiles (see :mod:`poptorch_sim.kernels.engine`): per-tile radix sorts of packed
(order-preserving key, index) items merged across tiles in supersteps, PopLibs-style bitonic
merge-and-keep-best for top-k, and a blocked greedy pass for NMS. Each op is a real
``torch.ops.poptorch_sim`` op with a fake (meta) implementation, so fx, ``torch.compile`` and
``torch.library.opcheck`` see it; ``sort`` and ``topk`` values are differentiable. CUDA
tensors run the generic implementations of :mod:`.generic.sorting` (``torch.sort`` and
torchvision's NMS under the same contracts), registered as the ops' CUDA kernels.

Contracts: ``sort``/``argsort``/``topk`` follow ``torch.sort``/``torch.topk`` (NaN sorts as the
largest value, ``-0.0`` equals ``0.0``), and are stable: equal values keep their input order,
as with ``torch.sort(..., stable=True)``. ``nms``/``batched_nms`` return exactly the indices
``torchvision.ops.nms``/``batched_nms`` return, in the same order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import simd_choice
from .engine import load_library

__all__ = ["argsort", "batched_nms", "nms", "sort", "topk"]

load_library()
_ops = torch.ops.poptorch_sim


_DEVICE_TYPES = ("cpu", "cuda", "meta")


def _check_device(name: str, *tensors: Tensor) -> None:
    for tensor in tensors:
        if tensor.device.type not in _DEVICE_TYPES:
            raise RuntimeError(
                f"poptorch_sim.kernels.{name}: the kernels run on the CPU (tile kernels) or on "
                f"CUDA (generic torch implementations), got a tensor on {tensor.device}; move "
                "it with .cpu() first"
            )


def sort(
    input: Tensor, dim: int = -1, descending: bool = False, stable: bool | None = None
) -> torch.return_types.sort:
    """Sorts ``input`` along ``dim`` over the tile engine, like :func:`torch.sort`.

    Args:
        input: a float32/float64/float16/bfloat16/int64/int32/int16/int8/uint8 tensor on the
            CPU or a CUDA device.
        dim: the dimension to sort along (default -1).
        descending: sort largest first (default False).
        stable: accepted for :func:`torch.sort` compatibility; the sort is always stable.

    Returns:
        ``(values, indices)`` as ``torch.return_types.sort``; indices are int64.

    Raises:
        RuntimeError: unsupported dtype or a tensor on neither the CPU nor CUDA.
        IndexError: ``dim`` out of range.

    >>> sort(torch.tensor([3.0, float("nan"), -1.0])).values
    tensor([-1.,  3., nan])
    """
    del stable
    _check_device("sort", input)
    simd_choice.first_use(simd_choice.sort_family(input, dim), input)
    values, indices = _ops.sort(input, dim, descending)
    return torch.return_types.sort((values, indices))


def argsort(input: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    """Returns the int64 indices that sort ``input`` along ``dim`` (stable), like ``torch.argsort``.

    Args:
        input: a CPU or CUDA tensor of a dtype :func:`sort` accepts.
        dim: the dimension to sort along (default -1).
        descending: sort largest first (default False).

    Returns:
        The indices, shaped like ``input``.

    >>> argsort(torch.tensor([2, 0, 1]))
    tensor([1, 2, 0])
    """
    _check_device("argsort", input)
    simd_choice.first_use(simd_choice.sort_family(input, dim), input)
    return _ops.argsort(input, dim, descending)


def topk(
    input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> torch.return_types.topk:
    """The ``k`` largest (or smallest) elements along ``dim``, like :func:`torch.topk`.

    Each tile keeps the best ``k`` of its slice; tiles then merge pairwise with bitonic
    merge-and-keep-best networks, as PopLibs does on an IPU. Among equal values the lowest
    index is chosen. Results come out sorted whatever ``sorted`` says (which it permits).

    Args:
        input: a CPU or CUDA tensor of a dtype :func:`sort` accepts.
        k: how many elements to keep, ``0 <= k <= input.size(dim)``.
        dim: the dimension to select along (default -1).
        largest: keep the largest (default) or the smallest.
        sorted: accepted for compatibility; results are always sorted.

    Returns:
        ``(values, indices)`` as ``torch.return_types.topk``.

    Raises:
        RuntimeError: ``k`` out of range, unsupported dtype, or a tensor on neither the CPU
            nor CUDA.

    >>> topk(torch.tensor([1.0, 5.0, 3.0]), 2).indices
    tensor([1, 2])
    """
    _check_device("topk", input)
    values, indices = _ops.topk(input, k, dim, largest, sorted)
    return torch.return_types.topk((values, indices))


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Non-maximum suppression with :func:`torchvision.ops.nms`'s exact contract.

    Boxes are ``(x1, y1, x2, y2)``; a box is dropped when its IoU with a kept, higher-scoring
    box is greater than ``iou_threshold``. Equal scores keep their input order.

    Args:
        boxes: ``[N, 4]`` float32 or float64 CPU or CUDA tensor without NaN.
        scores: ``[N]`` tensor of the same dtype.
        iou_threshold: the IoU above which a box is suppressed.

    Returns:
        int64 indices of the kept boxes, by decreasing score.

    Raises:
        RuntimeError: wrong shapes, dtypes or devices, or NaN coordinates.

    >>> nms(torch.tensor([[0.0, 0, 2, 2], [0, 0, 2, 1.9]]), torch.tensor([0.9, 0.8]), 0.5)
    tensor([0])
    """
    _check_device("nms", boxes, scores)
    _first_nms(boxes, scores)
    return _ops.nms(boxes, scores, float(iou_threshold))


def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    """Per-category NMS with :func:`torchvision.ops.batched_nms`'s exact contract.

    Boxes of different categories (``idxs``) never suppress each other. Up to 1000 boxes
    this reproduces torchvision's coordinate-offset trick bit for bit; above, one NMS per
    category, spread over the tiles.

    Args:
        boxes: ``[N, 4]`` float32 or float64 CPU or CUDA tensor without NaN.
        scores: ``[N]`` tensor of the same dtype.
        idxs: ``[N]`` integer category of each box.
        iou_threshold: the IoU above which a box is suppressed.

    Returns:
        int64 indices of the kept boxes, by decreasing score.

    Raises:
        RuntimeError: wrong shapes, dtypes or devices, or NaN coordinates.

    >>> boxes = torch.tensor([[0.0, 0, 2, 2], [0, 0, 2, 1.9]])
    >>> batched_nms(boxes, torch.tensor([0.9, 0.8]), torch.tensor([0, 1]), 0.5)
    tensor([0, 1])
    """
    _check_device("batched_nms", boxes, scores, idxs)
    _first_nms(boxes, scores)
    return _ops.batched_nms(boxes, scores, idxs, float(iou_threshold))


def _first_nms(boxes: Tensor, scores: Tensor) -> None:
    """NMS runs its own family and sorts the scores as one row (``csrc/sort/nms.cpp``)."""
    simd_choice.first_use("nms", boxes, scores)
    simd_choice.first_use(simd_choice.sort_family(scores), scores)


def _dim_of(input: Tensor, dim: int) -> int:
    rank = max(input.dim(), 1)
    if not -rank <= dim < rank:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], "
            f"but got {dim})"
        )
    return dim % rank


@torch.library.register_fake("poptorch_sim::sort")
def _sort_fake(input: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    _dim_of(input, dim)
    values = torch.empty_like(input, memory_format=torch.contiguous_format)
    return values, torch.empty_like(values, dtype=torch.int64)


@torch.library.register_fake("poptorch_sim::argsort")
def _argsort_fake(input: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    _dim_of(input, dim)
    return torch.empty_like(input, dtype=torch.int64, memory_format=torch.contiguous_format)


@torch.library.register_fake("poptorch_sim::topk")
def _topk_fake(
    input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[Tensor, Tensor]:
    shape = list(input.shape)
    if shape:
        shape[_dim_of(input, dim)] = k
    values = input.new_empty(shape)
    return values, values.new_empty(shape, dtype=torch.int64)


def _nms_fake_result(boxes: Tensor) -> Tensor:
    kept = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty((kept,), dtype=torch.int64)


@torch.library.register_fake("poptorch_sim::nms")
def _nms_fake(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    return _nms_fake_result(boxes)


@torch.library.register_fake("poptorch_sim::batched_nms")
def _batched_nms_fake(boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float) -> Tensor:
    return _nms_fake_result(boxes)


def _setup_scatter_back(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    input, dim = inputs[0], inputs[2] if len(inputs) == 5 else inputs[1]
    ctx.input_shape = input.shape
    ctx.other_inputs = len(inputs) - 1
    ctx.dim = _dim_of(input, dim) if input.dim() else 0
    ctx.save_for_backward(output[1])


def _scatter_back(ctx: Any, grad_values: Tensor, grad_indices: Tensor | None) -> tuple:
    # Values are input elements moved by `indices`; their gradient moves back the same way.
    (indices,) = ctx.saved_tensors
    grad_input = grad_values.new_zeros(ctx.input_shape)
    if grad_input.dim() == 0:
        grad_input = grad_values.reshape(()).clone() if indices.numel() else grad_input
    else:
        grad_input.scatter_(ctx.dim, indices, grad_values)
    return (grad_input, *([None] * ctx.other_inputs))


torch.library.register_autograd(
    "poptorch_sim::sort", _scatter_back, setup_context=_setup_scatter_back
)
torch.library.register_autograd(
    "poptorch_sim::topk", _scatter_back, setup_context=_setup_scatter_back
)
