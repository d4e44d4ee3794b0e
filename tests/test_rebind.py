"""Models whose forward reaches their modules through a closure or a global, not through self.

See [Note: modules reached outside self]: the device copy must compute with, and train, its own
copies of those modules, exactly as the eager loop trains the user's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.executor.rebind import rebind_to_copies


def closure_model(staged: bool) -> nn.Module:
    base = nn.Linear(6, 6)
    head = nn.Linear(6, 3)

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = base
            self.head = poptorch.BeginBlock(head, ipu_id=1) if staged else head

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = head(torch.relu(base(x)))  # the closure's modules, not self.base / self.head
            return out, nn.functional.cross_entropy(out, y)

    return WithLoss()


GLOBAL_LAYER = nn.Linear(6, 3)


class ThroughGlobal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = GLOBAL_LAYER

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = GLOBAL_LAYER(x)
        return out, nn.functional.cross_entropy(out, y)


def train_both(model: nn.Module, ga: int, steps: int) -> tuple[dict, dict]:
    """State dicts after ``steps`` training calls with poptorch_sim and with the eager loop.

    Both train ``model`` itself, one after the other from the same start: a deep copy of it would
    not do for the oracle, as the copy's forward still calls the closure's (original) modules.
    """
    start = copy.deepcopy(model.state_dict())
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(ga)
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.5)
    )
    x, y = torch.randn(ga * 2, 6), torch.randint(0, 3, (ga * 2,))
    for _ in range(steps):
        training(x, y)
    ours = copy.deepcopy(model.state_dict())
    training.destroy()
    model.load_state_dict(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(steps):
        train_reference(model, optimizer, (x, y), 1, ga, 1)
    return ours, model.state_dict()


@pytest.mark.parametrize("staged", [False, True], ids=["single-ipu", "pipelined"])
def test_closure_modules_are_trained_like_eager(staged: bool) -> None:
    model = closure_model(staged)
    start = copy.deepcopy(model.state_dict())
    ours, eager = train_both(model, ga=4 if staged else 2, steps=3)
    for name, value in eager.items():
        assert not torch.equal(value, start[name]), f"{name} was not trained"
        torch.testing.assert_close(ours[name], value, msg=name)


def test_module_reached_through_a_global_is_trained_like_eager() -> None:
    GLOBAL_LAYER.reset_parameters()
    model = ThroughGlobal()
    start = copy.deepcopy(model.state_dict())
    ours, eager = train_both(model, ga=2, steps=3)
    assert not torch.equal(eager["layer.weight"], start["layer.weight"])
    torch.testing.assert_close(ours, eager)


def test_rebind_points_closure_and_global_at_the_copies_only() -> None:
    model = closure_model(staged=False)
    memo: dict[int, object] = {}
    device = copy.deepcopy(model, memo)
    rebuilt = rebind_to_copies(device, memo)
    assert f"{type(model).__qualname__}.forward" in rebuilt
    cells = {id(c.cell_contents) for c in type(device).forward.__closure__}
    assert id(device.base) in cells and id(model.base) not in cells
    assert isinstance(device, type(model)) and type(model).forward.__closure__ is not None
    host_cells = {id(c.cell_contents) for c in type(model).forward.__closure__}
    assert id(model.base) in host_cells  # the host's class is untouched
    g = ThroughGlobal()
    memo = {}
    g_device = copy.deepcopy(g, memo)
    rebind_to_copies(g_device, memo)
    assert type(g_device).forward.__globals__["GLOBAL_LAYER"] is g_device.layer
    assert globals()["GLOBAL_LAYER"] is g.layer


def test_rebind_leaves_models_that_use_self_alone() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    memo: dict[int, object] = {}
    device = copy.deepcopy(model, memo)
    assert rebind_to_copies(device, memo) == []
    assert type(device) is nn.Sequential
