"""Batch norms with half weights and float running statistics run, against eager PyTorch with
the statistics cast by hand (eager PyTorch on a CPU refuses the mix itself)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poptorch
from poptorch_sim.executor.batchnorm import frozen_running_stats


def _half_bn_float_stats() -> nn.BatchNorm2d:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.running_mean += torch.randn(4)
        bn.running_var += torch.rand(4)
        bn.weight += torch.randn(4) * 0.1
    bn.half()
    bn.running_mean = bn.running_mean.float()
    bn.running_var = bn.running_var.float()
    return bn


def _reference(
    bn: nn.BatchNorm2d, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the mix means: normalise with the statistics in the input's type, keep them in float."""
    mean, var = bn.running_mean.half(), bn.running_var.half()
    out = nn.functional.batch_norm(
        x, mean, var, bn.weight, bn.bias, bn.training, bn.momentum, bn.eps
    )
    return out, mean.float(), var.float()


def test_eager_pytorch_refuses_the_mix_on_a_cpu() -> None:
    with pytest.raises(RuntimeError, match="expected scalar type Half but found Float"):
        _half_bn_float_stats().eval()(torch.randn(2, 4, 3, 3).half())


class _WithStats(nn.Module):
    def __init__(self, bn: nn.BatchNorm2d) -> None:
        super().__init__()
        self.bn = bn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.bn(x), self.bn.running_mean, self.bn.running_var


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_half_batch_norm_with_float_statistics(training: bool) -> None:
    bn = _half_bn_float_stats().train(training)
    before = bn.running_mean.clone(), bn.running_var.clone()
    ref, _, _ = _reference(copy.deepcopy(bn), x := torch.randn(2, 4, 3, 3).half())
    out, dev_mean, dev_var = poptorch.inferenceModel(_WithStats(bn))(x)
    torch.testing.assert_close(out, ref)
    assert out.dtype == torch.float16
    # The statistics stay float and, in an inference model, unchanged even in training mode
    # (PopTorch's inference graph never writes them back; see executor/batchnorm.py).
    assert dev_mean.dtype == dev_var.dtype == torch.float32
    assert torch.equal(dev_mean, before[0]) and torch.equal(dev_var, before[1])
    assert torch.equal(bn.running_mean, before[0]) and bn.track_running_stats


class _Counting(nn.Module):
    """A training-mode BatchNorm beside a buffer that forward updates in place."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.calls += 1
        return self.bn(x), self.bn.running_mean, self.bn.num_batches_tracked, self.calls.clone()


def test_inference_keeps_running_statistics_but_updates_other_buffers() -> None:
    torch.manual_seed(0)
    model, x = _Counting(), torch.randn(5, 3)
    ref = nn.functional.batch_norm(x, None, None, model.bn.weight, model.bn.bias, training=True)
    inference = poptorch.inferenceModel(model)
    for calls in (1, 2):
        out, mean, tracked, seen = inference(x)
        torch.testing.assert_close(out, ref)  # the batch's own statistics, as in training mode
        assert torch.equal(mean, torch.zeros(3)) and int(tracked) == 0
        assert float(seen) == calls
    assert model.bn.training and model.bn.track_running_stats


def test_overlapping_calls_keep_the_statistics_frozen_until_the_last_one_ends() -> None:
    # Calls of one model may overlap (overlapped IO, a served model): the first to end must not
    # let the other's BatchNorm update its statistics.
    model = _Counting()
    first, second = frozen_running_stats(model), frozen_running_stats(model)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not model.bn.track_running_stats
    second.__exit__(None, None, None)
    assert model.bn.track_running_stats
