"""trainingModel / inferenceModel against the eager PyTorch loops they stand for."""

from __future__ import annotations

import copy

import pytest
import torch
from oracle import expected_output, train_reference
from torch import nn

import poptorch_sim as poptorch

OPTIMIZERS = {
    "SGD": lambda p: poptorch.optim.SGD(p, lr=0.05, momentum=0.9),
    "Adam": lambda p: poptorch.optim.Adam(p, lr=0.01),
    "AdamW": lambda p: poptorch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "RMSprop": lambda p: poptorch.optim.RMSprop(p, lr=0.01),
    "LAMB": lambda p: poptorch.optim.LAMB(p, lr=0.01),
    "torch.SGD": lambda p: torch.optim.SGD(p, lr=0.05),
}
MODES = [
    poptorch.OutputMode.All,
    poptorch.OutputMode.EveryN,
    poptorch.OutputMode.Final,
    poptorch.OutputMode.Sum,
    poptorch.OutputMode.Default,
]


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, self.loss(out, y)


def _period(mode: poptorch.OutputMode, di: int) -> int | None:
    return di if mode == poptorch.OutputMode.EveryN else None


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("replicas", [1, 2], ids=lambda v: f"R{v}")
@pytest.mark.parametrize("ga", [1, 4], ids=lambda v: f"GA{v}")
@pytest.mark.parametrize("di", [1, 3], ids=lambda v: f"DI{v}")
def test_training_matches_eager(di: int, ga: int, replicas: int, mode, opt_name: str) -> None:
    mb = 2
    model = Classifier()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(di).replicationFactor(replicas)
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(mode, _period(mode, di))
    training = poptorch.trainingModel(model, opts, OPTIMIZERS[opt_name](model.parameters()))
    ref_opt = OPTIMIZERS[opt_name](reference.parameters())
    n = mb * di * ga * replicas
    x, y = torch.randn(n, 6), torch.randint(0, 3, (n,))

    for _ in range(2):
        out, loss = training(x, y)
        outs = train_reference(reference, ref_opt, (x, y), di, ga, replicas)
        resolved = poptorch.OutputMode.Final if mode == poptorch.OutputMode.Default else mode
        period = _period(mode, di) or 1
        torch.testing.assert_close(out, expected_output(outs, resolved, period, lambda o: o[0]))
        torch.testing.assert_close(loss, expected_output(outs, resolved, period, lambda o: o[1]))
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("replicas", [1, 2], ids=lambda v: f"R{v}")
@pytest.mark.parametrize("di", [1, 3], ids=lambda v: f"DI{v}")
def test_inference_matches_eager(di: int, replicas: int, mode) -> None:
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
    opts = poptorch.Options().deviceIterations(di).replicationFactor(replicas)
    opts.outputMode(mode, _period(mode, di))
    inference = poptorch.inferenceModel(model, opts)
    x = torch.randn(3 * di * replicas, 6)
    with torch.no_grad():
        per_mb = model(x).reshape(di, 1, replicas, 3, 2)
    outs = [[[per_mb[d, 0, r] for r in range(replicas)]] for d in range(di)]
    resolved = poptorch.OutputMode.All if mode == poptorch.OutputMode.Default else mode
    expected = expected_output(outs, resolved, _period(mode, di) or 1, lambda o: o)
    torch.testing.assert_close(inference(x), expected)


@pytest.mark.parametrize("reduction", ["Mean", "Sum"])
def test_gradient_reduction(reduction: str) -> None:
    model = Classifier()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().replicationFactor(2)
    opts.Training.gradientAccumulation(3)
    opts.Training.accumulationAndReplicationReductionType(
        getattr(poptorch.ReductionType, reduction)
    )
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    training(x, y)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.01)
    train_reference(reference, ref_opt, (x, y), 1, 3, 2, mean=reduction == "Mean")
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param)


def test_loss_scaling_and_gradient_clipping_match_torch() -> None:
    model = Classifier()
    reference = copy.deepcopy(model)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=512.0, max_grad_norm=0.05)
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(model, opts, opt)
    x, y = torch.randn(8, 6) * 10, torch.randint(0, 3, (8,))
    training(x, y)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    train_reference(reference, ref_opt, (x, y), 2, 2, 1, clip=0.05)
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param)


def test_input_replica_grouping_feeds_groups_the_same_data() -> None:
    model = nn.Linear(4, 2)
    opts = poptorch.Options().replicationFactor(4)
    opts.inputReplicaGrouping(2, poptorch.CommGroupType.Consecutive)
    inference = poptorch.inferenceModel(model, opts)
    x = torch.randn(2 * 3, 4)  # IG = 2 groups of 3 rows
    out = inference(x)
    with torch.no_grad():
        groups = model(x).reshape(2, 3, 2)
    expected = torch.cat([groups[0], groups[0], groups[1], groups[1]])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("opt_name", ["AdamW", "LAMB", "SGD"])
def test_optimizer_state_off_chip_matches_on_chip(opt_name: str) -> None:
    from poptorch_sim.kernels.optim import offload_reset_stats, offload_stats

    results = []
    for on_chip in (True, False):
        torch.manual_seed(0)
        model = Classifier()
        opts = poptorch.Options().deviceIterations(2)
        opts.Training.gradientAccumulation(2)
        opts.TensorLocations.setOptimizerLocation(
            poptorch.TensorLocationSettings().useOnChipStorage(on_chip)
        )
        training = poptorch.trainingModel(model, opts, OPTIMIZERS[opt_name](model.parameters()))
        offload_reset_stats()
        training(torch.randn(8, 6), torch.randint(0, 3, (8,)))
        streamed = offload_stats()["chunks"]
        assert (streamed > 0) == (not on_chip)
        results.append([p.detach().clone() for p in model.parameters()])
    for on, off in zip(*results):
        torch.testing.assert_close(on, off, rtol=0, atol=0)


@pytest.mark.parametrize("bn_train", [False, True], ids=["bn-eval", "bn-train"])
def test_frozen_model_trains_nothing_but_runs_like_eager(capfd, bn_train: bool) -> None:
    """All parameters frozen (fine-tuning setups, PopTorch's own tests): no error, a warning."""

    class Frozen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(5, 5)
            self.bn = nn.BatchNorm1d(5)

        def forward(self, x: torch.Tensor, y: torch.Tensor):
            out = self.bn(self.fc(x))
            return out, nn.functional.mse_loss(out, y)

    model = Frozen()
    model.requires_grad_(False)
    model.bn.train(bn_train)
    eager = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=1.0)
    )
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    out, _ = training(x, y)
    assert "does not depend on any parameter that requires grad" in capfd.readouterr().err
    expected = [eager(x[i : i + 4], y[i : i + 4])[0] for i in (0, 4)][-1]
    torch.testing.assert_close(out, expected)
    for (name, ours), theirs in zip(model.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(ours, theirs, msg=name)


def test_inputs_that_require_grad_are_detached_with_poptorchs_warning(capfd) -> None:

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.fc(x)
            return out, out.abs().mean() + nn.functional.l1_loss(out, torch.zeros_like(out))

    model = WithLoss()
    x = torch.randn(3, 2, requires_grad=True)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    out, _ = training(x)
    assert "This tensor will be detached because backward pass via inputs is not supported" in (
        capfd.readouterr().err
    )
    assert x.grad is None  # eager PyTorch would have filled it; PopTorch does not
    assert not out.requires_grad


def test_the_detached_input_warning_is_given_at_every_compile(capfd) -> None:
    # PopTorch warns while it traces (``_preprocessGraph``): at each compile, once per input
    # tensor that requires grad, and not when the compiled model is called again.
    warning = "Input tensor has requires_grad=True set"
    x = torch.randn(4, 2, requires_grad=True)
    for _ in range(2):
        inference = poptorch.inferenceModel(nn.Linear(2, 2))
        capfd.readouterr()
        inference(x)
        assert capfd.readouterr().err.count(warning) == 1
        inference(x)
        assert warning not in capfd.readouterr().err
        inference.destroy()
