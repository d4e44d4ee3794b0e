"""Replica-grouped parameters (``model.W.replicaGrouping(...)``) against eager PyTorch.

Each replica must compute what an eager model holding its group's value computes, and training
must update each group's value from the gradients of that group's replicas only (summed over the
group, divided by the whole replication factor for a Mean reduction, as PopART does).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import poptorch
from poptorch_sim.executor.replica_groups import ReplicaGrouping, replica_groups

CG = poptorch.CommGroupType
MODE = poptorch.VariableRetrievalMode


class Grouped(nn.Module):
    """``x @ W`` and a mean-square loss; optionally an unused buffer (one-thread replicas)."""

    def __init__(self, w: torch.Tensor, buffer: bool = False) -> None:
        super().__init__()
        self.W = nn.Parameter(w.clone())
        if buffer:
            self.register_buffer("unused", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = x @ self.W
        return z, poptorch.identity_loss(z**2, reduction="mean")


def _options(replicas: int) -> poptorch.Options:
    opts = poptorch.Options()
    opts.replicationFactor(replicas)
    opts.outputMode(poptorch.OutputMode.All)
    return opts


@pytest.mark.parametrize(
    ("kind", "size", "expected"),
    [
        (CG.All, 0, [0, 0, 0, 0, 0, 0, 0, 0]),
        (CG.Consecutive, 4, [0, 0, 0, 0, 1, 1, 1, 1]),
        (CG.Consecutive, 2, [0, 0, 1, 1, 2, 2, 3, 3]),
        (CG.Orthogonal, 2, [0, 1, 2, 3, 0, 1, 2, 3]),
        (CG.Orthogonal, 4, [0, 1, 0, 1, 0, 1, 0, 1]),
        (CG.NoGrouping, 0, [0, 1, 2, 3, 4, 5, 6, 7]),
    ],
)
def test_groups_of_replicas(kind: CG, size: int, expected: list[int]) -> None:
    # The tables of PopART's "Grouping graph replicas" (group size = replicas per group).
    assert replica_groups(ReplicaGrouping(kind, size, MODE.OnePerGroup), 8) == expected


@pytest.mark.parametrize("kind", [CG.Consecutive, CG.Orthogonal, CG.NoGrouping])
def test_inference_each_replica_uses_its_group_value(kind: CG) -> None:
    replicas, size = 4, 2
    groups = replica_groups(ReplicaGrouping(kind, size, MODE.OnePerGroup), replicas)
    w = torch.randn(max(groups) + 1, 5, 3)
    x = torch.randn(replicas * 2, 5)
    model = poptorch.inferenceModel(Grouped(w), _options(replicas))
    model.W.replicaGrouping(kind, size, MODE.OnePerGroup)
    out, _ = model(x)
    expected = torch.cat([x[2 * r : 2 * r + 2] @ w[groups[r]] for r in range(replicas)])
    torch.testing.assert_close(out, expected)


def _eager_steps(
    w: torch.Tensor, xs: list[torch.Tensor], groups: list[int], make_opt, steps: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Each group an eager model: its gradient is the sum over its replicas' loss gradients
    divided by the replication factor (a Mean reduction over every replica)."""
    replicas = len(groups)
    params = [nn.Parameter(w[g].clone()) for g in range(w.shape[0])]
    opts = [make_opt([p]) for p in params]
    losses = []
    for _ in range(steps):
        for opt in opts:
            opt.zero_grad()
        per_replica = []
        for r in range(replicas):
            loss = ((xs[r] @ params[groups[r]]) ** 2).mean()
            (loss / replicas).backward()
            per_replica.append(loss.detach())
        for opt in opts:
            opt.step()
        losses.append(torch.stack(per_replica))
    return torch.stack([p.detach() for p in params]), losses


@pytest.mark.parametrize("buffer", [False, True], ids=["replica threads", "one thread"])
@pytest.mark.parametrize(
    ("kind", "size", "optimizer"),
    [
        (CG.Orthogonal, 2, "sgd"),
        (CG.Consecutive, 2, "adamw"),
        (CG.NoGrouping, 0, "sgd"),
    ],
)
def test_training_updates_each_group_from_its_replicas(
    kind: CG, size: int, optimizer: str, buffer: bool
) -> None:
    torch.manual_seed(0)
    replicas, steps = 4, 3
    groups = replica_groups(ReplicaGrouping(kind, size, MODE.OnePerGroup), replicas)
    w = torch.randn(max(groups) + 1, 6, 3) * 0.3
    x = torch.randn(replicas * 2, 6)
    xs = [x[2 * r : 2 * r + 2] for r in range(replicas)]

    def make_opt(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return torch.optim.AdamW(params, lr=0.01)

    expected_w, expected_losses = _eager_steps(w, xs, groups, make_opt, steps)
    model = Grouped(w, buffer)
    training = poptorch.trainingModel(model, _options(replicas), make_opt(model.parameters()))
    training.W.replicaGrouping(kind, size, MODE.OnePerGroup)
    for step in range(steps):
        _, loss = training(x)
        torch.testing.assert_close(loss, expected_losses[step], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.W.detach(), expected_w, rtol=1e-5, atol=1e-6)
    training.destroy()


def test_optimizer_state_has_one_value_per_group() -> None:
    model = Grouped(torch.randn(4, 6))
    optimizer = poptorch.optim.AdamW(model.parameters(), 0.1)
    training = poptorch.trainingModel(model, _options(4), optimizer=optimizer)
    training.W.replicaGrouping(CG.NoGrouping, 0, MODE.OnePerGroup)
    training(torch.randn(4, 6))
    state = optimizer.state_dict()["ipu_state"]
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        "Accl1___W": (4, 6),
        "Accl2___W": (4, 6),
        "Step___W": (4,),
    }
    training.setOptimizer(optimizer)  # the per-group state goes back up
    training(torch.randn(4, 6))
    training.destroy()


def test_all_replicas_retrieval_and_upload() -> None:
    replicas = 4
    w = torch.randn(2, 5, 3)
    host = Grouped(w)
    training = poptorch.trainingModel(
        host, _options(replicas), torch.optim.SGD(host.parameters(), lr=0.1)
    )
    training.W.replicaGrouping(CG.Orthogonal, 2, MODE.AllReplicas)
    training(torch.randn(replicas, 5))
    training.copyWeightsToHost()
    read = host.W.detach().clone()
    assert read.shape == (replicas, 5, 3)  # one value per replica
    torch.testing.assert_close(read[0], read[2])  # replicas 0 and 2 share group 0
    torch.testing.assert_close(read[1], read[3])
    assert not torch.equal(read[0], read[1])
    # upload from one value per replica: each group takes its first replica's row
    with torch.no_grad():
        host.W.mul_(0).add_(torch.arange(replicas).view(-1, 1, 1).float())
    training.copyWeightsToDevice()
    x = torch.ones(replicas, 5)
    inference = poptorch.inferenceModel(Grouped(torch.zeros(2, 5, 3)), _options(replicas))
    inference.W.replicaGrouping(CG.Orthogonal, 2, MODE.OnePerGroup)
    with torch.no_grad():
        inference.model.W.copy_(torch.stack([torch.zeros(5, 3), torch.ones(5, 3)]))
    out, _ = inference(x)
    torch.testing.assert_close(out[:, 0], torch.tensor([0.0, 5.0, 0.0, 5.0]))
    training.copyWeightsToHost()
    torch.testing.assert_close(host.W[:, 0, 0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    training.destroy()


def test_refusals() -> None:
    model = poptorch.inferenceModel(Grouped(torch.randn(3, 5, 3)), _options(4))
    model.W.replicaGrouping(CG.Consecutive, 2, MODE.OnePerGroup)
    with pytest.raises(
        poptorch.Error, match=r"must hold one value per group: shape \[2, \.\.\.\]"
    ):
        model(torch.randn(4, 5))

    model = poptorch.inferenceModel(Grouped(torch.randn(2, 5, 3)), _options(4))
    model.W.replicaGrouping(CG.Orthogonal, 3, MODE.OnePerGroup)
    with pytest.raises(poptorch.Error, match="group size 3 must .* divide the replication"):
        model(torch.randn(4, 5))

    model = poptorch.inferenceModel(Grouped(torch.randn(2, 5, 3)), _options(4))
    with pytest.raises(poptorch.Error, match="shards .* must be an int"):
        model.W.replicaGrouping(CG.Orthogonal, "2", MODE.OnePerGroup)

    host = Grouped(torch.randn(2, 5, 3))
    lamb = poptorch.optim.LAMB(host.parameters(), lr=0.1)
    training = poptorch.trainingModel(host, _options(4), lamb)
    training.W.replicaGrouping(CG.Consecutive, 2, MODE.OnePerGroup)
    with pytest.raises(poptorch.Error, match="not supported in poptorch_sim with LAMB"):
        training(torch.randn(4, 5))
    training.destroy()

    host = Grouped(torch.randn(2, 5, 3))
    adam = poptorch.optim.Adam(host.parameters(), lr=0.1, max_grad_norm=1.0)
    training = poptorch.trainingModel(host, _options(4), adam)
    training.W.replicaGrouping(CG.Consecutive, 2, MODE.OnePerGroup)
    with pytest.raises(poptorch.Error, match=r"not supported in poptorch_sim with max_grad_norm"):
        training(torch.randn(4, 5))
    training.destroy()

    model = poptorch.inferenceModel(Grouped(torch.randn(2, 5, 3)), _options(4))
    model.W.replicaGrouping(CG.Consecutive, 2, MODE.OnePerGroup)
    model(torch.randn(4, 5))
    with pytest.raises(poptorch.Error, match="after the model was compiled"):
        model.W.replicaGrouping(CG.NoGrouping, 0, MODE.OnePerGroup)
    assert model.W.shape == (2, 5, 3)  # other attributes are the parameter's


@pytest.mark.parametrize("buffer", [False, True], ids=["replica threads", "one thread"])
def test_gradient_accumulation_sums_within_the_group(buffer: bool) -> None:
    # Every micro-batch the same sample: each group's gradient is its 2 replicas x 2 micro-batches
    # of the same gradient, divided by GA x R = 8.
    w = torch.randn(2, 5, 3)
    host = Grouped(w, buffer)
    opts = _options(4)
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(host, opts, torch.optim.SGD(host.parameters(), lr=0.1))
    training.W.replicaGrouping(CG.Consecutive, 2, MODE.OnePerGroup)
    x = torch.randn(1, 5).expand(16, 5).contiguous()
    training(x)
    expected = []
    for g in range(2):
        p = nn.Parameter(w[g].clone())
        ((x[:2] @ p) ** 2).mean().backward()
        expected.append(w[g] - 0.1 * p.grad * (2 * 2) / 8)
    torch.testing.assert_close(host.W.detach(), torch.stack(expected))
    training.destroy()


def test_wrapper_attribute_stands_for_the_parameter() -> None:
    # model.W carries replicaGrouping, and is used as the parameter everywhere else.
    host = nn.Linear(3, 2)
    model = poptorch.inferenceModel(host)
    w = model.weight
    assert isinstance(w, nn.Parameter)
    torch.testing.assert_close(w[1], host.weight[1])
    torch.testing.assert_close(w @ torch.ones(3), host.weight.sum(1))
    torch.testing.assert_close(torch.add(w, 1), host.weight + 1)
    torch.testing.assert_close(
        nn.functional.linear(torch.ones(1, 3), w, model.bias), host(torch.ones(1, 3))
    )
    assert w.shape == (2, 3) and len(w) == 2
