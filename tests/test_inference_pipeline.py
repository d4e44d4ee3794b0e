"""Forward-only pipelines overlap their stages across the device iterations of one call.

See [Note: inference pipelines span device iterations] in poptorch_sim/executor/staged.py. The
overlap is checked with a handshake, not a clock: stage 1 holds micro-batch 0 until stage 0 has
started micro-batch 1, which can only happen if both stages work at the same time.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import fx, nn

import poptorch_sim as poptorch

_STAGE0_ON_MB1 = threading.Event()
_SEEN: list[bool] = []
_HANDSHAKE_S = 20.0  # only reached if the stages do not overlap


@fx.wrap
def _stage0_mark(x: torch.Tensor) -> torch.Tensor:
    if int(x[0, 0]) == 1:
        _STAGE0_ON_MB1.set()
    return x + 0


@fx.wrap
def _stage1_hold(x: torch.Tensor) -> torch.Tensor:
    if int(x[0, 0]) == 0:
        _SEEN.append(_STAGE0_ON_MB1.wait(_HANDSHAKE_S))
    return x * 2


class Mark(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _stage0_mark(x)


class Hold(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _stage1_hold(x)


def _compile(inference: poptorch.PoplarExecutor, x: torch.Tensor) -> None:
    """Compile (tracing may run the stages once) with the handshake open, then arm it."""
    _STAGE0_ON_MB1.set()
    inference.compile(x)
    _STAGE0_ON_MB1.clear()
    _SEEN.clear()


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-replica", "two-replicas"])
def test_inference_stages_work_on_different_micro_batches_at_once(replicas: int) -> None:
    model = nn.Sequential(
        poptorch.BeginBlock(Mark(), "S0", ipu_id=0), poptorch.BeginBlock(Hold(), "S1", ipu_id=1)
    )
    opts = poptorch.Options().deviceIterations(4).replicationFactor(replicas)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    inference = poptorch.inferenceModel(model, opts)
    # Row i of the call is micro-batch i: [DI, R, mb] order with mb = 1.
    x = torch.arange(4.0 * replicas).reshape(4 * replicas, 1)
    _compile(inference, x)
    out = inference(x)
    torch.testing.assert_close(out, x * 2)
    assert _SEEN == [True], "stage 1 never saw stage 0 start micro-batch 1 while it held 0"
    inference.destroy()


def test_sharded_inference_runs_one_stage_at_a_time() -> None:
    # The same handshake cannot complete when stages take turns: the wait times out.
    _STAGE0_ON_MB1.clear()
    _SEEN.clear()
    model = nn.Sequential(
        poptorch.BeginBlock(Mark(), "S0", ipu_id=0), poptorch.BeginBlock(Hold(), "S1", ipu_id=1)
    )
    opts = poptorch.Options().deviceIterations(2)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    inference = poptorch.inferenceModel(model, opts)
    _compile(inference, torch.arange(2.0).reshape(2, 1))
    global _HANDSHAKE_S
    saved, _HANDSHAKE_S = _HANDSHAKE_S, 0.2
    try:
        x = torch.arange(2.0).reshape(2, 1)
        torch.testing.assert_close(inference(x), x * 2)
    finally:
        _HANDSHAKE_S = saved
    assert _SEEN == [False]
    inference.destroy()
