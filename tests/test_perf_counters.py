"""getPerfCounters and the latencies: one list per tensor, one time per step, per OutputMode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch


class Pair(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y


def _shape(perf: dict) -> dict:
    return {k: (len(v), {len(steps) for steps in v}) for k, v in perf.items()}


def test_before_any_run_each_event_has_one_empty_list() -> None:
    model = poptorch.inferenceModel(Pair())
    assert model.getPerfCounters() == {
        k: [[]] for k in ("input", "input_complete", "output", "output_complete")
    }
    assert model.getLatency() == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "mode, period, outsteps",
    [
        (poptorch.OutputMode.All, 1, 4 * 2),
        (poptorch.OutputMode.EveryN, 2, 4 // 2 * 2),
        (poptorch.OutputMode.Final, 1, 2),
        (poptorch.OutputMode.Sum, 1, 2),
    ],
    ids=["All", "EveryN", "Final", "Sum"],
)
def test_inference_steps_per_tensor_follow_the_output_mode(mode, period, outsteps) -> None:
    opts = poptorch.Options().deviceIterations(4).replicationFactor(2).outputMode(mode, period)
    model = poptorch.inferenceModel(Pair(), opts)
    model(torch.randn(8, 3, 3), torch.randn(8, 3, 3))
    perf = model.getPerfCounters()
    assert _shape(perf) == {
        "input": (2, {8}),
        "input_complete": (2, {8}),
        "output": (1, {outsteps}),
        "output_complete": (1, {outsteps}),
    }
    inputs = perf["input"][0]
    assert inputs == sorted(inputs)  # one micro-batch after another
    for get in (model.getLatency, model.getComputeLatency, model.getHostIpuLatency):
        low, high, mean = get()
        assert 0.0 <= low <= mean <= high


def test_training_counts_every_accumulated_micro_batch() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x, target):
            out = self.lin(x)
            return out, nn.functional.mse_loss(out, target)

    opts = poptorch.Options().deviceIterations(2).outputMode(poptorch.OutputMode.All)
    opts.Training.gradientAccumulation(3)
    model = poptorch.trainingModel(Net(), opts)
    model(torch.randn(6, 3), torch.randn(6, 3))
    assert _shape(model.getPerfCounters())["input"] == (2, {6})
    assert _shape(model.getPerfCounters())["output"] == (2, {6})


def test_synthetic_data_moves_nothing() -> None:
    opts = poptorch.Options().deviceIterations(2)
    opts.enableSyntheticData(True)
    model = poptorch.inferenceModel(Pair(), opts)
    model(torch.randn(2, 3, 3), torch.randn(2, 3, 3))
    assert _shape(model.getPerfCounters())["input"] == (2, {0})
    assert model.getLatency() == (0.0, 0.0, 0.0)
