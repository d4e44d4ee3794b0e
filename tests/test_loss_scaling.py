"""Automatic loss scaling: PopART's factor rule, its ipu_state entry and the finalLossScale anchor."""

from __future__ import annotations

import copy

import torch
from torch import nn

import poptorch_sim as poptorch


class Net(nn.Module):
    def __init__(self, gain: float = 1.0) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gain = gain

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.lin(x)
        return out, poptorch.identity_loss((out * self.gain).sum(), reduction="none")


def _training(model: nn.Module, loss_scaling: float = 1.0):
    opts = poptorch.Options()
    opts.Training.setAutomaticLossScaling(True)
    opts.anchorTensor("final", "finalLossScale", poptorch.OutputMode.Final)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.01, loss_scaling=loss_scaling)
    return poptorch.trainingModel(model, opts, opt), opt


def test_small_float16_gradients_double_the_factor_and_train_like_eager() -> None:
    torch.manual_seed(0)
    model = Net().half()
    reference = copy.deepcopy(model)
    training, opt = _training(model, loss_scaling=2.0)
    eager = torch.optim.SGD(reference.parameters(), lr=0.01)
    x = torch.randn(2, 4).half()
    training.compile(x)
    factors = []
    for _ in range(4):
        factors.append(float(opt.state_dict()["ipu_state"]["lossScaleUpdateFactor"]))
        training(x)
        assert float(training.getAnchoredTensor("final")) == 2.0 * factors[-1]
        eager.zero_grad()
        reference(x)[1].backward()
        eager.step()
    assert factors == [1.0, 2.0, 4.0, 8.0]
    training.copyWeightsToHost()
    torch.testing.assert_close(model.lin.weight, reference.lin.weight)  # float16 tolerance
    # Power-of-two scales are exact in float16: bit for bit the run without loss scaling.
    torch.manual_seed(0)
    plain = Net().half()
    fixed = poptorch.trainingModel(
        plain, optimizer=poptorch.optim.SGD(plain.parameters(), lr=0.01)
    )
    for _ in range(4):
        fixed(x)
    fixed.copyWeightsToHost()
    torch.testing.assert_close(model.lin.weight, plain.lin.weight, rtol=0, atol=0)


def test_gradients_in_the_upper_bin_halve_the_factor() -> None:
    # |grad| >= 65504 / 16 in float16: the upper bin is not empty.
    model = Net(gain=8192.0).half()
    training, opt = _training(model)
    training(torch.ones(2, 4).half())
    assert float(opt.state_dict()["ipu_state"]["lossScaleUpdateFactor"]) == 0.5


def test_float32_gradients_leave_the_factor_alone_and_a_written_factor_is_used() -> None:
    training, opt = _training(Net())
    training(torch.randn(2, 4))
    state = opt.state_dict()
    assert float(state["ipu_state"]["lossScaleUpdateFactor"]) == 1.0
    state["ipu_state"]["lossScaleUpdateFactor"] = torch.tensor(4.0)
    opt.load_state_dict(state)
    training(torch.randn(2, 4))
    assert float(training.getAnchoredTensor("final")) == 4.0
