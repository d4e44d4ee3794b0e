"""Dynamic slicing: ``dynamic_slice`` and ``dynamic_update``, slices whose start is a tensor.

The slice has a static ``size``; only its start is known at run time. Numerically both follow
PopTorch's CPU implementations: ``tensor[..., start:start + size:step]`` along ``dim`` and
``torch.slice_scatter``, and both are differentiable.

[Note: dynamic slice offsets] The start is data, so it may be out of range (a model compiled
with one index tensor and run with another, or an index that walks past the end). On the
IPU, PopLibs' dynamic slice vertices compute positions modulo the sliced dimension's length,
and never fail. Both ops do the same: an out-of-range slice wraps around, element ``i`` being
position ``(start + i) % length``; in-range slices are the plain slices above.
"""

from __future__ import annotations

import torch

from ..errors import createPoptorchError
from ..runtime.dtypes import host_dtype
from .fx_leaf import fx_leaf

__all__ = ["dynamic_slice", "dynamic_update"]

_INDEX_TYPES = (torch.int16, torch.int32, torch.int64)


def _start_index(start: torch.Tensor) -> int:
    if start.dtype not in _INDEX_TYPES:
        raise createPoptorchError(
            f"Expected integer typed start tensor; got a tensor of {start.dtype}. "
            "Cast the start index with .long() or .int()."
        )
    if start.numel() < 1:
        raise createPoptorchError("The start tensor of a dynamic slice must not be empty.")
    return int(start.reshape(-1)[0])


def _check_size(size: int) -> None:
    if size == 0:
        raise createPoptorchError("The start and end of a slice must be different.")
    if size < 0:
        raise createPoptorchError(
            "Taking a slice of a tensor with the end less than the start is not supported."
        )


def _check_dim(tensor: torch.Tensor, dim: int) -> int:
    if not -tensor.dim() <= dim < max(tensor.dim(), 1):
        raise createPoptorchError(
            f"Dimension {dim} is out of range for a tensor of rank {tensor.dim()}."
        )
    return dim % max(tensor.dim(), 1)


@fx_leaf()
def dynamic_slice(
    tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    """Slice ``size`` elements of ``tensor`` along ``dim`` from the run-time index ``start``.

    Args:
        tensor: the tensor to slice.
        dim: the dimension to slice.
        start: an integer tensor holding the first index.
        size: the static length of the slice (before ``step``); must divide the dimension.
        step: take every ``step``-th element of the slice (at least 1).

    Returns:
        ``tensor`` sliced along ``dim`` as ``[start:start + size:step]``.

    Raises:
        poptorch.Error: wrong argument types, a size that is not positive or does not divide
            the dimension, a step below 1, or a non-integer start tensor.

    >>> dynamic_slice(torch.arange(8), 0, torch.tensor([2]), 4, 1)
    tensor([2, 3, 4, 5])
    """
    if not isinstance(tensor, torch.Tensor):
        raise createPoptorchError(
            f"dynamic_slice must take a torch.tensor input. {type(tensor)} is not supported."
        )
    if not isinstance(dim, int):
        raise createPoptorchError("Dimension must be an integer.")
    if not isinstance(start, torch.Tensor):
        raise createPoptorchError(
            "Slice start argument to dynamic_slice must be a torch.tensor. "
            f"{type(start)} is not supported."
        )
    if not isinstance(size, int):
        raise createPoptorchError("Size must be an integer.")
    if not isinstance(step, int):
        raise createPoptorchError("Step must be an integer.")
    _check_size(size)
    if step < 1:
        raise createPoptorchError("Slicing step must be at least 1")
    dim = _check_dim(tensor, dim)
    length = tensor.shape[dim]
    if length % size != 0:
        raise createPoptorchError(
            f"The size of the slice ({size}) must be a factor of the slicing dimension ({length})."
        )
    first = _start_index(start)
    if 0 <= first and first + size <= length:
        index = [slice(None)] * dim + [slice(first, first + size, step)]
        return tensor[tuple(index)]
    # See [Note: dynamic slice offsets]
    positions = torch.arange(first, first + size, step, device=tensor.device) % length
    return tensor.index_select(dim, positions)


def _check_update_args(
    input: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> None:
    if not isinstance(input, torch.Tensor):
        raise createPoptorchError(
            f"dynamic_update must take a torch.tensor input. {type(input)} is not supported."
        )
    if not isinstance(dim, int):
        raise createPoptorchError("Dimension must be an integer.")
    if not isinstance(start, torch.Tensor):
        raise createPoptorchError(
            "Slice start argument to dynamic_update must be a torch.tensor. "
            f"{type(start)} is not supported."
        )
    if not isinstance(src, torch.Tensor):
        raise createPoptorchError(
            f"Src argument to dynamic_update must be a torch.tensor. {type(src)} is not supported."
        )
    if not isinstance(size, int):
        raise createPoptorchError("Size must be an integer.")
    if input.dim() != src.dim():
        raise createPoptorchError(
            "input and src tensors must have same dimensionality. "
            f"({input.dim()}) vs ({src.dim()})"
        )
    if input.dtype != src.dtype:
        raise createPoptorchError(
            # Named as the IPU holds them (int64 is int32 there), as PopTorch names them.
            "input and src tensor must have same dtype. "
            f"({host_dtype(input.dtype)} vs {host_dtype(src.dtype)})"
        )


@fx_leaf()
def dynamic_update(
    input: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> torch.Tensor:
    """Return ``input`` with ``src`` written along ``dim`` from the run-time index ``start``.

    Args:
        input: the tensor to update (not modified: a new tensor is returned).
        src: the values to write; same rank and dtype as ``input``, ``size`` long along ``dim``.
        dim: the dimension to update.
        start: an integer tensor holding the first index.
        size: the static length of the update.

    Returns:
        A copy of ``input`` with ``input[..., start:start + size] = src`` along ``dim``.

    Raises:
        poptorch.Error: wrong argument types, mismatched rank/dtype/length, a size that is not
            positive, or a non-integer start tensor.

    >>> dynamic_update(torch.zeros(4), torch.ones(2), 0, torch.tensor([1]), 2)
    tensor([0., 1., 1., 0.])
    """
    _check_update_args(input, src, dim, start, size)
    _check_size(size)
    dim = _check_dim(input, dim)
    first = _start_index(start)
    end = first + size
    if src.shape[dim] != size:
        raise createPoptorchError(
            f"dynamic_update: src is {src.shape[dim]} long along dimension {dim} but size is "
            f"{size}; they must be equal."
        )
    length = input.shape[dim]
    if size > length:
        raise createPoptorchError(
            f"dynamic_update: the update is {size} long along dimension {dim} but the input "
            f"is only {length} long."
        )
    if 0 <= first and end <= length:
        return torch.slice_scatter(input, src, dim, first, end, 1)
    # See [Note: dynamic slice offsets]
    positions = torch.arange(first, end, device=input.device) % length
    return input.index_copy(dim, positions, src)
