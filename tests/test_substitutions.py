"""PopTorch's substitution hook (``poptorch._poplar_executor._OverwriteContextManager``): add-on
packages swap library functions while a model compiles and runs; eager PyTorch with the same swap
is the oracle."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import poptorch
from poptorch_sim.compat.overwrite import _OverwriteContextManager, substitutions


class Scale(nn.Module):
    """A library layer whose forward an add-on package replaces."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([1.5, -2.0, 0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 2  # a dynamic output shape, which compiling refuses


def _static_forward(self: Scale, x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x * self.weight, torch.zeros_like(x))


class SwapScale:
    """A substitution manager in the shape add-on packages register (replace / restore)."""

    entered = 0

    def replace(self) -> None:
        type(self).entered += 1
        self.saved = Scale.forward
        Scale.forward = _static_forward  # type: ignore[method-assign]

    def restore(self) -> None:
        Scale.forward = self.saved  # type: ignore[method-assign]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(x) + 1


@pytest.fixture
def swap() -> Iterator[type[SwapScale]]:
    SwapScale.entered = 0
    _OverwriteContextManager.registerSubsitutionManager(SwapScale)
    yield SwapScale
    _OverwriteContextManager._subsitution_manager_types.remove(SwapScale)


def test_inference_runs_the_substituted_forward_like_eager(swap: type[SwapScale]) -> None:
    model = Net()
    x = torch.tensor([[1.0, -1.0, 3.0], [0.5, 2.0, -4.0]])
    with _OverwriteContextManager():
        expected = model(x)
    ipu = poptorch.inferenceModel(model)
    torch.testing.assert_close(ipu(x), expected)
    torch.testing.assert_close(ipu(x * 2), (expected - 1) * 2 + 1)
    assert Scale.forward is not _static_forward  # restored after each call
    assert swap.entered >= 2  # at compile and at the next run


def test_training_matches_eager_under_the_substitution(swap: type[SwapScale]) -> None:
    torch.manual_seed(1)
    x = torch.randn(4, 3)
    reference, model = Net(), Net()
    model.load_state_dict(reference.state_dict())

    class WithLoss(nn.Module):
        def __init__(self, net: Net) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.net(x)
            return out, poptorch.identity_loss(out.pow(2).mean(), reduction="none")

    eager_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        with _OverwriteContextManager():
            loss = WithLoss(reference)(x)[1]
        eager_opt.zero_grad()
        loss.backward()
        eager_opt.step()
    wrapped = WithLoss(model)
    ipu = poptorch.trainingModel(wrapped, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2):
        ipu(x)
    ipu.copyWeightsToHost()
    torch.testing.assert_close(model.scale.weight, reference.scale.weight)


def test_without_the_substitution_compiling_refuses_the_dynamic_shape() -> None:
    with pytest.raises(Exception, match="aten.index"):
        poptorch.inferenceModel(Net())(torch.tensor([1.0, -1.0, 3.0]))


def test_substitutions_nest_and_enter_each_manager_once(swap: type[SwapScale]) -> None:
    with substitutions():
        with substitutions():
            assert Scale.forward is _static_forward
        assert Scale.forward is _static_forward
    assert Scale.forward is not _static_forward
    assert swap.entered == 1


def test_a_failing_manager_restores_those_already_entered(swap: type[SwapScale]) -> None:
    class Broken:
        def replace(self) -> None:
            raise RuntimeError("cannot swap")

        def restore(self) -> None:
            raise AssertionError("never entered, never restored")

    _OverwriteContextManager.registerSubsitutionManager(Broken)
    try:
        with pytest.raises(RuntimeError, match="cannot swap"), substitutions():
            pass
        assert Scale.forward is not _static_forward
    finally:
        _OverwriteContextManager._subsitution_manager_types.remove(Broken)


def test_add_on_packages_load_the_module_by_path_and_find_the_same_class() -> None:
    # poptorch_geometric: find_spec(...).loader.load_module(), before and after a plain import
    code = (
        "import importlib.util, poptorch\n"
        "spec = importlib.util.find_spec('poptorch._poplar_executor')\n"
        "first = spec.loader.load_module()\n"
        "import poptorch._poplar_executor as pe\n"
        "again = importlib.util.find_spec('poptorch._poplar_executor').loader.load_module()\n"
        "from poptorch_sim.compat.overwrite import _OverwriteContextManager as cls\n"
        "assert first is pe is again, (first, pe, again)\n"
        "assert pe._OverwriteContextManager is cls\n"
        "assert pe.PoplarExecutor is poptorch.PoplarExecutor\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr
    assert importlib.util.find_spec("poptorch._poplar_executor") is not None
