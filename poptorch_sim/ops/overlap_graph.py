"""PopTorch's graph rules on ``set_overlap_for_input`` / ``set_overlap_for_output``.

PopTorch checks where the markers sit in the traced graph:

    rule                                                PopTorch's error
    an input marker is applied to a model input         ... applied on a node which is not a
                                                        tensor input to the model.
    the marker is the first op on that input            ... must be the only op applied to an
                                                        input. This is not the case for input N
    an output marker's tensor is returned               ... applied on a node which is not a
                                                        tensor output to the model.
    a marked output is returned once                    ... cannot be used with a tensor that is
                                                        returned twice. ...

Simulated: the executor runs the first micro-batch under ``OverlapGraphChecks`` (compile time):
a torch-function mode notes which inputs an op has read, the markers check against it, and the
model's output leaves are checked when it returns. A use of the input after its marker is not
seen (the marker returns the same tensor), nor are the stages of a pipelined program.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ..errors import createPoptorchError

__all__ = ["OverlapGraphChecks", "check_marked_input", "note_marked_output"]

_active = threading.local()

NOT_INPUT = (
    "poptorch.set_overlap_for_input applied on a node which is not a tensor input to the model."
)
NOT_ONLY_OP = (
    "poptorch.set_overlap_for_input must be the only op applied to an input. This is not the "
    "case for input {index} to the model."
)
NOT_OUTPUT = (
    "poptorch.set_overlap_for_output applied on a node which is not a tensor output to the model."
)
RETURNED_TWICE = (
    "poptorch.set_overlap_for_output cannot be used with a tensor that is returned twice. "
    "Please check all returned tensors including those nested in tuples/lists."
)


class OverlapGraphChecks(TorchFunctionMode):
    """Check the overlap markers of one run of ``forward`` against its inputs and outputs."""

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        super().__init__()
        self.inputs = {id(t): i for i, t in enumerate(inputs)}
        self._keep = inputs  # the ids stay valid while the check runs
        self.read: set[int] = set()
        self.marked_outputs: list[torch.Tensor] = []

    def __enter__(self) -> OverlapGraphChecks:
        _active.checks = self
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _active.checks = None
        super().__exit__(*exc)

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        for leaf in pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor) and id(leaf) in self.inputs:
                self.read.add(id(leaf))
        return func(*args, **kwargs)

    def check_outputs(self, leaves: list[Any]) -> None:
        """Raise PopTorch's error for a marked output not returned, or returned twice."""
        for marked in self.marked_outputs:
            count = sum(1 for leaf in leaves if leaf is marked)
            if count == 0:
                raise createPoptorchError(NOT_OUTPUT)
            if count > 1:
                raise createPoptorchError(RETURNED_TWICE)


def _current() -> OverlapGraphChecks | None:
    return getattr(_active, "checks", None)


def check_marked_input(tensors: Any) -> None:
    """Raise PopTorch's error if a leaf is not a model input, or was read before its marker."""
    checks = _current()
    if checks is None:
        return
    for leaf in pytree.tree_leaves(tensors):
        index = checks.inputs.get(id(leaf))
        if index is None:
            raise createPoptorchError(NOT_INPUT)
        if id(leaf) in checks.read:
            raise createPoptorchError(NOT_ONLY_OP.format(index=index))


def note_marked_output(tensors: Any) -> None:
    """Remember the marked leaves, to check against what the model returns."""
    checks = _current()
    if checks is not None:
        checks.marked_outputs += [t for t in pytree.tree_leaves(tensors) if torch.is_tensor(t)]
