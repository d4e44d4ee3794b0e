"""Serving requests: checking them, joining several into one host batch, splitting the outputs.

A model compiled for ``N = deviceIterations × replicas`` micro-batches of ``mb`` rows serves
``N × mb`` rows per call. Requests of ``k × mb`` rows (``1 ≤ k ≤ N``) fill that batch in
arrival order, each occupying ``k`` consecutive micro-batch slots; rows left over when the
batching timeout expires are zeros (PopRT's rule), and their outputs are dropped::

    slots      0    1    2    3        (N = 4, mb rows each)
    rows      [ A  ][ B       ][ 0  ]   A: 1 slot, B: 2 slots, one slot zero-filled
    outputs   [ A' ][ B'      ][ -- ]   output slot i belongs to input slot i (OutputMode.All)
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import Error
from ..executor.inputs import BoundArgs

__all__ = ["Request", "Signature", "join", "split"]


@dataclass
class Request:
    """One caller's inputs and the future its outputs go to."""

    bound: BoundArgs
    slots: int  # micro-batch slots the request fills
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)


@dataclass(frozen=True)
class _Leaf:
    dtype: torch.dtype
    row_shape: tuple[int, ...]


class Signature:
    """What every request must look like: the first request's structure, dtypes, row shapes
    and non-tensor values, with any number of rows that is a multiple of ``micro_batch_size``.

    Args:
        first: the first request's bound inputs.
        micro_batch_size: rows per micro-batch (``None``: the first request's rows).
        slots: ``N``, the micro-batch slots of one model call.
    """

    def __init__(self, first: BoundArgs, micro_batch_size: int | None, slots: int) -> None:
        self.spec = _spec(first)
        self.leaves = [_Leaf(t.dtype, tuple(t.shape[1:])) for t in _tensors(first)]
        self.mb = micro_batch_size if micro_batch_size is not None else _rows(first)
        self.slots = slots
        if self.mb < 1:
            raise Error(f"micro_batch_size must be at least 1, got {self.mb}")

    def check(self, bound: BoundArgs) -> int:
        """Raise a clear error unless ``bound`` fits; return the slots it fills."""
        if _spec(bound) != self.spec:
            raise Error(
                "request does not match the runner's inputs: its structure or non-tensor values "
                f"differ from the first request's ({_spec(bound)} != {self.spec})"
            )
        rows = _rows(bound)
        for i, (t, leaf) in enumerate(zip(_tensors(bound), self.leaves)):
            if t.dtype != leaf.dtype or tuple(t.shape[1:]) != leaf.row_shape:
                raise Error(
                    f"request input {i} is {t.dtype} of rows {tuple(t.shape[1:])}; the runner "
                    f"takes {leaf.dtype} of rows {leaf.row_shape}"
                )
            if t.shape[0] != rows:
                raise Error(
                    f"request inputs disagree on their batch size ({t.shape[0]} rows in input "
                    f"{i}, {rows} in input 0): every input needs the same number of rows"
                )
        if rows % self.mb != 0 or not 0 < rows <= self.mb * self.slots:
            raise Error(
                f"request of {rows} rows: the runner takes a multiple of the micro-batch size "
                f"({self.mb}) up to one model call's batch ({self.slots} micro-batches = "
                f"{self.mb * self.slots} rows)"
            )
        return rows // self.mb


def _tensors(bound: BoundArgs) -> list[torch.Tensor]:
    return bound.tensors()


def _rows(bound: BoundArgs) -> int:
    tensors = _tensors(bound)
    if not tensors or any(t.dim() == 0 for t in tensors):
        raise Error("every request input must be a tensor with a batch dimension (dim 0)")
    return int(tensors[0].shape[0])


def _spec(bound: BoundArgs) -> str:
    """The request's structure with its non-tensor values (tensors as ``T``), for comparing."""
    return repr(bound.map_tensors(lambda t: "T"))


def join(requests: list[Request], signature: Signature) -> BoundArgs:
    """One model call's inputs: the requests' rows in order, then zero rows up to ``N × mb``.

    Returns:
        The first request's structure holding the joined tensors.
    """
    free = (signature.slots - sum(r.slots for r in requests)) * signature.mb
    columns = list(zip(*(_tensors(r.bound) for r in requests)))
    joined = []
    for column in columns:
        parts = list(column)
        if free:
            parts.append(column[0].new_zeros((free, *column[0].shape[1:])))
        joined.append(torch.cat(parts) if len(parts) > 1 else parts[0])
    values = iter(joined)
    return requests[0].bound.map_tensors(lambda _: next(values))


def split(output: Any, requests: list[Request], slots: int) -> list[Any]:
    """Each request's share of a model call's output (views of its rows, structure kept).

    Args:
        output: what the model returned (``OutputMode.All``: every tensor's dim 0 holds the
            ``slots`` micro-batches one after the other).
        requests: the requests joined into that call, in order.
        slots: ``N``.
    """
    leaves, spec = pytree.tree_flatten(output)
    shares = []
    start = 0
    for request in requests:
        end = start + request.slots
        mine = [_rows_of(leaf, start, end, slots) for leaf in leaves]
        shares.append(pytree.tree_unflatten(mine, spec))
        start = end
    return shares


def _rows_of(leaf: Any, start: int, end: int, slots: int) -> Any:
    if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
        return leaf
    per_slot = leaf.shape[0] // slots
    return leaf[start * per_slot : end * per_slot]
