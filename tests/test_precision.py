"""PopTorch's float16 rule: layer weights follow the activation's dtype (master weights).

See [Note: weights follow the activation]. The oracle is the eager loop with the casts written
out by hand, which is what PopTorch's rule means.
"""

from __future__ import annotations

import copy

import pytest
import torch
from oracle import train_reference
from torch import nn
from torch.nn import functional as F

import poptorch_sim as poptorch


class Master(nn.Module):
    """float32 weights fed a float16 activation; ``by_hand`` writes PopTorch's casts out."""

    def __init__(self, by_hand: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 2)
        self.fc = nn.Linear(27, 4)
        self.by_hand = by_hand

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.half()
        if self.by_hand:
            h = F.conv1d(x, self.conv.weight.half(), self.conv.bias.half())
            out = F.linear(torch.relu(h).flatten(1), self.fc.weight.half(), self.fc.bias.half())
        else:
            out = self.fc(torch.relu(self.conv(x)).flatten(1))
        return out, F.mse_loss(out.float(), y)


def test_float16_activations_train_float32_master_weights_like_eager() -> None:
    model = Master()
    eager = copy.deepcopy(model)
    eager.by_hand = True
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    x, y = torch.randn(4, 2, 10), torch.randn(4, 4)
    for _ in range(3):
        out, _ = training(x, y)
    assert out.dtype == torch.float16
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(3):
        outs = train_reference(eager, eager_opt, (x, y), 1, 2, 1)
    torch.testing.assert_close(out, outs[0][-1][0][0])
    for (name, ours), theirs in zip(model.named_parameters(), eager.parameters()):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, theirs, msg=name)


@pytest.mark.parametrize(
    ("activation", "weights"),
    [
        (torch.float32, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float16),
        (torch.float16, torch.float16),
    ],
    ids=["f32-f32", "f16-act-f32-weights", "f32-act-f16-weights", "f16-f16"],
)
@pytest.mark.parametrize("layer", [nn.Linear(6, 3), nn.Conv2d(6, 3, 1)], ids=["linear", "conv"])
def test_layer_computes_in_its_activation_dtype(layer, activation, weights) -> None:
    layer = copy.deepcopy(layer).to(weights)
    x = torch.randn(2, 6, 1, 1) if isinstance(layer, nn.Conv2d) else torch.randn(2, 6)
    out = poptorch.inferenceModel(layer)(x.to(activation))
    assert out.dtype == activation
    expected = copy.deepcopy(layer).to(activation)(x.to(activation))
    torch.testing.assert_close(out, expected)


def test_a_layer_with_its_own_forward_is_left_alone() -> None:
    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = poptorch.inferenceModel(Scaled(3, 3))
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        model(torch.randn(2, 3).half())


_TRAPS = {
    "div-by-zero": (lambda x: x / torch.zeros_like(x), torch.ones(3)),
    "zero-times-inf": (lambda x: x * torch.full_like(x, float("inf")), torch.zeros(3)),
    "sqrt-negative": (torch.sqrt, -torch.ones(3)),
    "nan-operand": (lambda x: x > torch.full_like(x, float("nan")), torch.ones(3)),
    "overflow": (torch.exp, torch.full((3,), 3800.0)),
}


class _Apply(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("case", list(_TRAPS))
def test_floating_point_exceptions_stop_the_run_only_when_enabled(case) -> None:
    fn, x = _TRAPS[case]
    expected = fn(x)  # eager torch: no trap, an inf / NaN / False result
    plain = poptorch.inferenceModel(_Apply(fn))
    torch.testing.assert_close(plain(x), expected, equal_nan=True)
    opts = poptorch.Options()
    opts.Precision.enableFloatingPointExceptions(True)
    trapping = poptorch.inferenceModel(_Apply(fn), opts)
    with pytest.raises(poptorch.Error, match="Floating-point exception in aten::"):
        trapping(x)


def test_floating_point_exceptions_leave_finite_models_as_eager() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Softmax(-1))
    model.eval()
    x = torch.randn(2, 4)
    opts = poptorch.Options()
    opts.Precision.enableFloatingPointExceptions(True)
    masked = x.masked_fill(x > 0, float("-inf"))  # an inf input is not an exception
    torch.testing.assert_close(poptorch.inferenceModel(model, opts)(x), model(x))
    torch.testing.assert_close(
        poptorch.inferenceModel(_Apply(torch.relu), opts)(masked), torch.relu(masked)
    )
