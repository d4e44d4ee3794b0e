"""Where poptorch_sim knowingly differs from PopTorch on an IPU (each is documented)."""

from __future__ import annotations

import torch
from torch import nn

import poptorch_sim as poptorch


def test_python_side_effects_in_forward_repeat_per_micro_batch() -> None:
    # An IPU runs a graph traced once; the single-IPU simulator runs forward per micro-batch
    # (see poptorch_sim/executor/eager.py), so Python counters advance every micro-batch.
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return x

    module = Counting()
    opts = poptorch.Options().deviceIterations(4)
    model = poptorch.inferenceModel(module, opts)
    model(torch.ones(4, 1))
    # The device copy counted: once at compile time (PopTorch's trace), then once per
    # micro-batch (an IPU would replay the traced graph and count nothing more).
    assert model._executable.device.model.calls == 1 + 4
    assert module.calls == 0


def test_float64_inputs_are_converted_before_the_model_sees_them() -> None:
    seen: list[torch.dtype] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.dtype)
            return x

    poptorch.inferenceModel(Probe())(torch.ones(2, dtype=torch.float64))
    assert set(seen) == {torch.float32}


def test_cycle_count_is_not_simulated() -> None:
    model = poptorch.inferenceModel(nn.Identity(), poptorch.Options().logCycleCount(True))
    model(torch.ones(1))
    try:
        model.cycleCount()
    except poptorch.Error as err:
        assert "only supported on actual IPU hardware" in str(err)
    else:
        raise AssertionError("cycleCount() should raise")


def test_cuda_runs_the_generic_kernels_which_the_tile_engine_does_not_count() -> None:
    # CUDA tensors run torch's kernels through poptorch_sim/kernels/generic/, not tile
    # kernels: the ops have CUDA kernels, and the engine counters see only the C++ ones.
    from poptorch_sim import kernels
    from poptorch_sim.kernels import generic

    for name in generic.KERNELS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"poptorch_sim::{name}", "CUDA")
    kernels.reset_counters()
    generic.sort(torch.randn(100))
    assert "sort" not in kernels.counters()
    kernels.sort(torch.randn(100))
    assert kernels.counters()["sort"].calls == 1
