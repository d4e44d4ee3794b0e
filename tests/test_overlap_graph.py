"""PopTorch's graph rules on where overlap markers sit, checked when the model compiles."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import poptorch

MODE = poptorch.OverlapMode.OverlapAccumulationLoop


def _opts() -> poptorch.Options:
    opts = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    opts.TensorLocations.numIOTiles(32)
    return opts


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _input_read_before_marker(x):
    y = x + 1
    return y, poptorch.set_overlap_for_input(x, MODE)


def _marker_on_a_computed_tensor(x):
    y = x + 1
    return poptorch.set_overlap_for_input(y, MODE)


def _marked_output_returned_twice(x):
    y = x + 1
    return y, poptorch.set_overlap_for_output(y, MODE)


def _marked_tensor_not_returned(x):
    x = poptorch.set_overlap_for_output(x, MODE)
    return x * 2


@pytest.mark.parametrize(
    "fn, message",
    [
        (_input_read_before_marker, r"must be the only op applied to an input\. This is not the "
         r"case for input 0 to the model\."),
        (_marker_on_a_computed_tensor, r"set_overlap_for_input applied on a node which is not a "
         r"tensor input to the model\."),
        (_marked_output_returned_twice, r"cannot be used with a tensor that is returned twice\."),
        (_marked_tensor_not_returned, r"set_overlap_for_output applied on a node which is not a "
         r"tensor output to the model\."),
    ],
    ids=["read-before-marker", "not-an-input", "returned-twice", "not-an-output"],
)  # fmt: skip
def test_misplaced_markers_are_refused_at_compile(fn, message) -> None:
    # Checked before the options (the default PipelinedExecution would be refused too).
    for opts in (poptorch.Options(), _opts()):
        with pytest.raises(poptorch.Error, match=message):
            poptorch.inferenceModel(_Fn(fn), opts).compile(torch.randn(4))


def test_well_placed_markers_run_as_eager() -> None:
    def fn(a, b):
        a = poptorch.set_overlap_for_input(a, MODE)
        b = poptorch.set_overlap_for_input(b, poptorch.OverlapMode.NoOverlap)
        y = a * b
        z = y + 1  # a marked output may also feed other ops
        return poptorch.set_overlap_for_output(y, MODE), z

    a, b = torch.randn(4, 3), torch.randn(4, 3)
    out = poptorch.inferenceModel(_Fn(fn), _opts())(a, b)
    torch.testing.assert_close(out[0], a * b)
    torch.testing.assert_close(out[1], a * b + 1)


def test_markers_outside_a_compile_check_nothing() -> None:
    x = torch.randn(3)
    y, marked = _input_read_before_marker(x)  # plain eager PyTorch: an identity
    assert marked is x
    torch.testing.assert_close(y, x + 1)
