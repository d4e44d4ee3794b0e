"""Annotation ops: identities that only steer PopART/Poplar (memory, recomputation, IO overlap).

Numerically each is an identity (``serializedMatMul`` is ``torch.matmul``); the simulator keeps
PopTorch's argument validation so that scripts fail here exactly where they fail on an IPU.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..enums import MatMulSerializationMode, OverlapMode
from ..errors import createPoptorchError
from .fx_leaf import fx_leaf, is_proxy
from .overlap_graph import check_marked_input, note_marked_output

__all__ = [
    "nop",
    "set_available_memory",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_overlap_for_input",
    "set_overlap_for_output",
    "overlapped_io_requested",
    "overlap_marks",
    "NameScope",
    "current_name_scope",
    "name_scope_depth",
    "Attribute",
    "current_attributes",
]


@fx_leaf()
def nop(tensor: torch.Tensor) -> torch.Tensor:
    """An identity that PopART never optimises away (useful for debugging).

    Args:
        tensor: any tensor.

    Returns:
        ``tensor``.

    Raises:
        poptorch.Error: ``tensor`` is not a tensor.

    >>> nop(torch.ones(1))
    tensor([1.])
    """
    if not isinstance(tensor, torch.Tensor):
        raise createPoptorchError(
            f"nop must take a torch.tensor argument. {type(tensor)} is not supported."
        )
    return tensor


@fx_leaf()
def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float) -> torch.Tensor:
    """Limit the temporary memory of the op that produced ``tensor`` (a planner hint).

    Args:
        tensor: the output of a convolution, matmul, embedding or indexing op.
        available_memory_proportion: proportion of tile memory, in (0, 1].

    Returns:
        ``tensor`` (an identity).

    Raises:
        poptorch.Error: ``tensor`` is not a tensor, or the proportion is out of range.

    >>> set_available_memory(torch.ones(1), 0.2)
    tensor([1.])
    """
    if not isinstance(tensor, torch.Tensor):
        raise createPoptorchError(
            "You may only set available memory for torch.tensor values. "
            f"{type(tensor)} is not supported."
        )
    proportion = available_memory_proportion
    if not isinstance(proportion, (int, float)) or not 0.0 < proportion <= 1.0:
        raise createPoptorchError(
            f"available_memory_proportion must be a number in (0, 1]; got {proportion!r}. "
            "It is the proportion of tile memory the op may use for temporary data."
        )
    return tensor


def recomputationCheckpoint(*tensors: Any) -> Any:
    """Keep these values in memory between forward and backward instead of recomputing them.

    With recomputation on (``_Popart.set("autoRecomputation", 3)``; not set, a pipelined
    training model over several IPUs with marks turns it on, as PopTorch's default does), a
    stage stashes its inputs and these values per micro-batch and recomputes the rest in
    backward; without recomputation the op is an identity.

    Args:
        tensors: one or more tensors, or a single list/tuple of tensors.

    Returns:
        The tensor itself for one tensor, a tuple for several, or a container of the same type
        when a single list/tuple was passed.

    Raises:
        ValueError: a value is not a tensor (PopTorch's message).

    >>> recomputationCheckpoint([torch.ones(1), torch.zeros(1)])
    [tensor([1.]), tensor([0.])]
    """
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        return type(tensors[0])(recomputationCheckpoint(*tensors[0]))
    for t in tensors:
        if not (isinstance(t, torch.Tensor) or is_proxy(t)):
            raise ValueError("All inputs must be tensors")
    # The op, as PopTorch calls it: the capture keeps it as a node of the stage, which
    # recomputation reads (see [Note: recomputation checkpoints] in runtime/checkpoints.py).
    marked = tuple(torch.ops.poptorch.recomputation_checkpoint(t) for t in tensors)
    if len(marked) == 1:
        return marked[0]
    return marked


_SERIALIZED_DIM = {
    MatMulSerializationMode.InputChannels: ("lhs", -2, "input channels"),
    MatMulSerializationMode.ReducingDim: ("lhs", -1, "reducing dimension"),
    MatMulSerializationMode.OutputChannels: ("rhs", -1, "output channels"),
}


def _check_serialization_factor(
    lhs: torch.Tensor, rhs: torch.Tensor, mode: MatMulSerializationMode, factor: int
) -> None:
    if mode is MatMulSerializationMode.Disabled or factor == 0:
        return
    if factor < 0:
        raise createPoptorchError(f"serializedMatMul: factor must be positive; got {factor}.")
    side, dim, what = _SERIALIZED_DIM[mode]
    operand = lhs if side == "lhs" else rhs
    if is_proxy(operand) or operand.dim() < 2:
        return
    size = operand.shape[dim]
    if size % factor != 0:
        raise createPoptorchError(
            f"serializedMatMul: factor ({factor}) must be a factor of the {what} ({size}) "
            f"serialized by {mode}."
        )


def serializedMatMul(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    mode: MatMulSerializationMode,
    factor: int = 0,
    keep_precision: bool = False,
) -> torch.Tensor:
    """``lhs @ rhs`` computed as ``factor`` smaller matmuls on an IPU (numerically a matmul).

    Args:
        lhs: left operand.
        rhs: right operand.
        mode: the dimension split (``poptorch.MatMulSerializationMode``).
        factor: number of pieces; must divide the split dimension.
        keep_precision: (half inputs) add the partial results in float32.

    Returns:
        ``torch.matmul(lhs, rhs)``.

    Raises:
        AssertionError: wrong argument types (PopTorch's type).
        poptorch.Error: ``factor`` does not divide the split dimension.

    >>> mode = MatMulSerializationMode.ReducingDim
    >>> serializedMatMul(torch.ones(2, 4), torch.ones(4, 3), mode, 2)
    tensor([[4., 4., 4.],
            [4., 4., 4.]])
    """
    if not isinstance(keep_precision, bool):
        raise AssertionError(f"keep_precision must be a bool; got {keep_precision!r}")
    if not isinstance(factor, int):
        raise AssertionError(f"factor must be an int; got {factor!r}")
    if not isinstance(mode, MatMulSerializationMode):
        raise AssertionError(f"mode must be a poptorch.MatMulSerializationMode; got {mode!r}")
    _check_serialization_factor(lhs, rhs, mode, factor)
    return torch.matmul(lhs, rhs)


_overlap = threading.local()


def overlap_marks() -> tuple[bool, bool]:
    """``(marked, overlapped)`` for this thread since the last call: whether any input or output
    was marked at all, and whether any was marked with a mode other than ``NoOverlap``.

    The executor calls it after tracing a model to choose its host IO (see
    runtime/io_tiles.py) and apply PopTorch's overlapped-IO checks; calling it resets the record.
    """
    marks = (bool(getattr(_overlap, "marked", False)), bool(getattr(_overlap, "requested", False)))
    _overlap.marked = _overlap.requested = False
    return marks


def overlapped_io_requested() -> bool:
    """Whether this thread marked any input/output for overlapped IO since the last call
    (``overlap_marks()[1]``; resets the record)."""
    return overlap_marks()[1]


def _mark_overlap(tensors: Any, mode: OverlapMode, what: str) -> Any:
    if not isinstance(mode, OverlapMode):
        raise createPoptorchError(
            f"set_overlap_for_{what} expects a poptorch.OverlapMode; got {mode!r}."
        )
    for leaf in pytree.tree_leaves(tensors):
        if not isinstance(leaf, torch.Tensor) and not is_proxy(leaf):
            # PopTorch's wording.
            raise createPoptorchError(
                f"You may only set overlap for torch.tensor {what}s. {type(leaf)} is not "
                "supported."
            )
    if what == "input":
        check_marked_input(tensors)
    else:
        note_marked_output(tensors)
    _overlap.marked = True
    if mode is not OverlapMode.NoOverlap:
        _overlap.requested = True
    return tensors


def set_overlap_for_input(input_tensors: Any, mode: OverlapMode) -> Any:
    """Overlap the host-to-IPU copy of these inputs with compute (needs IO tiles).

    Simulated: once any input or output of a model is marked with a mode other than
    ``NoOverlap`` (and the options pass PopTorch's checks), an inference model loads every
    input and stores every output on its IO threads (runtime/io_tiles.py), marked or not, and
    both modes overlap across device iterations and calls alike. A model whose marks are all
    ``NoOverlap`` and that has ``numIOTiles`` set does the same copies just in time, one phase
    after the other, as PopTorch's NoOverlap (compute tiles, JustInTime) does; without marks,
    or without IO tiles, the simulator's host memory is its device memory and inputs are not
    copied. PopTorch's graph rules on the marks (an input marker on a model input, before any
    other use; a marked output returned once) are checked at compile time (ops/overlap_graph.py).
    See tests/test_footguns.py.

    Args:
        input_tensors: a tensor or any nesting of tuples, lists and dicts of tensors.
        mode: a ``poptorch.OverlapMode``.

    Returns:
        ``input_tensors`` (an identity).

    Raises:
        poptorch.Error: ``mode`` is not an ``OverlapMode``, or a leaf is not a tensor.

    >>> set_overlap_for_input(torch.ones(1), OverlapMode.NoOverlap)
    tensor([1.])
    """
    return _mark_overlap(input_tensors, mode, "input")


def set_overlap_for_output(output_tensors: Any, mode: OverlapMode) -> Any:
    """Overlap the IPU-to-host copy of these outputs with compute (needs IO tiles).

    Simulated: see ``set_overlap_for_input``.

    Args:
        output_tensors: a tensor or any nesting of tuples, lists and dicts of tensors.
        mode: a ``poptorch.OverlapMode``.

    Returns:
        ``output_tensors`` (an identity).

    Raises:
        poptorch.Error: ``mode`` is not an ``OverlapMode``, or a leaf is not a tensor.

    >>> set_overlap_for_output({"y": torch.ones(1)}, OverlapMode.OverlapAccumulationLoop)
    {'y': tensor([1.])}
    """
    return _mark_overlap(output_tensors, mode, "output")


_scopes = threading.local()


def current_name_scope() -> str:
    """The active ``NameScope`` names of this thread joined with ``/`` (``""`` when none)."""
    return "/".join(getattr(_scopes, "stack", []))


def name_scope_depth() -> int:
    """How many ``NameScope`` s this thread has open (an empty name is a scope too)."""
    return len(getattr(_scopes, "stack", []))


class NameScope:
    """Prefix the names of the ops created inside with ``name`` (a context manager).

    >>> with NameScope("encoder"):
    ...     current_name_scope()
    'encoder'
    """

    def __init__(self, name: str):
        """Args: name: the prefix. Raises: AssertionError: ``name`` is not a string."""
        if not isinstance(name, str):
            raise AssertionError("Parameter to NameScope must be a string")
        self.name = name

    def __enter__(self) -> NameScope:
        if not hasattr(_scopes, "stack"):
            _scopes.stack = []
        _scopes.stack.append(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        _scopes.stack.pop()


class Attribute:
    """Attach PopART attributes to the ops created inside: ``Attribute(**{attr: {key: value}})``.

    Nested scopes merge their dictionaries; leaving a scope restores the previous values.

    >>> with Attribute(__outline={"layer": "embedding"}):
    ...     current_attributes()
    {'__outline': {'layer': 'embedding'}}
    """

    _current_attrs: dict[str, dict[str, Any]] = {}

    def __init__(self, **kwargs: dict[str, Any]):
        """Args: kwargs: attribute name -> dictionary of key/value pairs."""
        for attr, dictionary in kwargs.items():
            if not isinstance(dictionary, dict):
                raise AttributeError(
                    f"poptorch.Attribute({attr}=...) expects a dictionary of key/value pairs; "
                    f"got {type(dictionary).__name__}"
                )
        self._kwargs = kwargs
        self._saved: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> Attribute:
        self._saved = {k: dict(v) for k, v in Attribute._current_attrs.items()}
        for attr, dictionary in self._kwargs.items():
            Attribute._current_attrs.setdefault(attr, {}).update(dictionary)
        return self

    def __exit__(self, *exc: object) -> None:
        Attribute._current_attrs = self._saved


def current_attributes() -> dict[str, dict[str, Any]]:
    """A copy of the attributes set by the enclosing ``Attribute`` scopes."""
    return {k: dict(v) for k, v in Attribute._current_attrs.items()}
