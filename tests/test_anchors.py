"""Anchored tensors (``Options.anchorTensor``) follow their output mode over device iterations, as
model outputs do, against the values of the eager PyTorch loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch

DI = 4
OutputMode = poptorch.OutputMode


class Model(nn.Module):
    """PopTorch's ``debug_tensors_test.Model``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 10)
        self.fc2 = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.fc2(torch.relu(self.fc1(x))), labels)


def _eager(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, ga: int) -> tuple[list, list]:
    """Per device iteration: fc2.bias's gradient, and fc2.weight after the step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads, weights = [], []
    xs, ys = x.chunk(DI * ga), labels.chunk(DI * ga)
    for d in range(DI):
        optimizer.zero_grad()
        for a in range(ga):
            (model(xs[d * ga + a], ys[d * ga + a]) / ga).backward()
        grads.append(model.fc2.bias.grad.clone())
        optimizer.step()
        weights.append(model.fc2.weight.detach().clone())
    return grads, weights


def _joined(values: list[torch.Tensor], mode: OutputMode, period: int) -> torch.Tensor:
    if mode == OutputMode.All:
        return torch.cat(values)
    if mode == OutputMode.EveryN:
        return torch.cat(values[period - 1 :: period])
    if mode == OutputMode.Final:
        return values[-1]
    return torch.stack(values).sum(0)


@pytest.mark.parametrize(
    ("mode", "period", "ga"),
    [
        (OutputMode.All, 1, 1),
        (OutputMode.EveryN, 2, 1),
        (OutputMode.Final, 1, 1),
        (OutputMode.Sum, 1, 1),
        (OutputMode.All, 1, 2),
        (None, 1, 1),  # the model's output mode (here All)
    ],
    ids=["All", "EveryN2", "Final", "Sum", "All-GA2", "model's"],
)
def test_anchored_tensors_follow_their_output_mode(
    mode: OutputMode | None, period: int, ga: int
) -> None:
    model = Model()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(DI).outputMode(OutputMode.All)
    opts.Training.gradientAccumulation(ga)
    opts.anchorTensor("grad_bias", "Gradient___fc2.bias", mode, period)
    opts.anchorTensor("update_weight", "UpdatedVar___fc2.weight", mode, period)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, labels = torch.randn(DI * ga * 5, 10), torch.randn(DI * ga * 5, 10)
    training(x, labels)
    grads, weights = _eager(reference, x, labels, ga)
    mode = OutputMode.All if mode is None else mode
    grad = training.getAnchoredTensor("grad_bias")
    weight = training.getAnchoredTensor("update_weight")
    torch.testing.assert_close(grad, _joined(grads, mode, period))
    torch.testing.assert_close(weight, _joined(weights, mode, period))
    if mode == OutputMode.All:
        assert grad.shape == (DI * 10,)  # as an output: dim 0 times the device iterations
    training.destroy()


@pytest.mark.parametrize("model_mode", [None, OutputMode.All], ids=["Final", "All"])
def test_an_anchor_period_that_does_not_fit_takes_the_models_mode(
    caplog: pytest.LogCaptureFixture, model_mode: OutputMode | None
) -> None:
    """PopTorch never refuses an anchor's EveryN period: its lowering hands every anchor to PopART
    with the model's output mode (debug_tensors_test anchors EveryN(4) with one device
    iteration). Such an anchor is returned as the model's outputs are, with a warning."""
    model = Model()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(DI)
    if model_mode is not None:
        opts.outputMode(model_mode)
    opts.anchorTensor("grad_bias", "Gradient___fc2.bias", OutputMode.EveryN, 3)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, labels = torch.randn(DI * 5, 10), torch.randn(DI * 5, 10)
    with caplog.at_level("DEBUG", logger="poptorch::python"):
        training(x, labels)
    grads, _ = _eager(reference, x, labels, 1)
    expected = grads[-1] if model_mode is None else torch.cat(grads)  # training: Final
    torch.testing.assert_close(training.getAnchoredTensor("grad_bias"), expected)
    assert "anchor ( Gradient___fc2.bias EVERYN/3 )" in caplog.text  # PopTorch's lowering line
    assert "Anchor 'grad_bias': output_return_period=3 is not a factor of deviceIterations=4" in (
        caplog.text
    )
    training.destroy()


def test_a_buffer_anchored_by_its_name_in_inference_is_the_eager_models() -> None:
    # vision/cnns' test_pretrained_batchnorm_fp16: a half BatchNorm with float running stats,
    # its running_mean and running_var anchored by their names.
    bn = nn.BatchNorm2d(8)
    bn.running_mean.copy_(torch.randn(8))
    bn.running_var.copy_(torch.rand(8) + 0.5)
    bn.half()  # the stats pass through half on the host, as in the app's test
    bn.running_mean, bn.running_var = bn.running_mean.float(), bn.running_var.float()
    reference = copy.deepcopy(bn).eval()
    opts = poptorch.Options().deviceIterations(2)
    opts.anchorTensor("mean", "running_mean")
    opts.anchorTensor("var", "running_var", OutputMode.Final)
    inference = poptorch.inferenceModel(bn, opts)
    inference(torch.ones(2, 8, 3, 3, dtype=torch.half))
    mean = inference.getAnchoredTensor("mean")  # the model's output mode: All, one per DI
    torch.testing.assert_close(mean, reference.running_mean.repeat(2))
    torch.testing.assert_close(inference.getAnchoredTensor("var"), reference.running_var)


def test_a_weight_anchored_by_its_name_in_training_is_the_eager_weight_after_each_step() -> None:
    model = Model()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(DI).outputMode(OutputMode.All)
    opts.anchorTensor("weight", "fc2.weight")
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, labels = torch.randn(DI * 5, 10), torch.randn(DI * 5, 10)
    training(x, labels)
    _, weights = _eager(reference, x, labels, 1)
    torch.testing.assert_close(training.getAnchoredTensor("weight"), torch.cat(weights))
    training.destroy()
