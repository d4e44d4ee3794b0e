"""Host ↔ device weights: PopTorch's lazy copies, explicit copies and linked inference models."""

from __future__ import annotations

import copy
import gc
import io

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.executor import weights
from poptorch_sim.executor.device_link import DeviceLink


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("steps", torch.zeros(()))
        self.loss = nn.MSELoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        self.steps += 1
        out = self.lin(x)
        return out, self.loss(out, y)


def _train(model: nn.Module, calls: int = 1) -> poptorch.PoplarExecutor:
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    for _ in range(calls):
        training(torch.randn(4, 3), torch.randn(4, 2))
    return training


def _count_implicit_copies(monkeypatch: pytest.MonkeyPatch, training) -> list[int]:
    counter = [0]
    original = DeviceLink.implicit_copy_to_host

    def counting(self):
        counter[0] += 1
        original(self)

    monkeypatch.setattr(DeviceLink, "implicit_copy_to_host", counting)
    return counter


def test_host_weights_copied_once_on_first_access(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Net()
    before = model.lin.weight.detach().clone()
    training = _train(model)
    counter = _count_implicit_copies(monkeypatch, training)
    training(torch.randn(4, 3), torch.randn(4, 2))
    assert counter[0] == 0
    assert not torch.equal(model.lin.weight, before)
    assert counter[0] == 1
    _ = model.lin.bias + 1
    _ = model.state_dict()
    assert counter[0] == 1


def test_host_sees_trained_weights_and_buffers() -> None:
    model = Net()
    reference = copy.deepcopy(model)
    training = _train(model, calls=3)
    device = training._executable.device.model
    torch.testing.assert_close(model.lin.weight, device.lin.weight)
    assert model.steps.item() == 3
    assert reference.steps.item() == 0


def test_parameter_held_before_training_is_synced() -> None:
    model = Net()
    weight = model.lin.weight
    training = _train(model)
    torch.testing.assert_close(weight, training._executable.device.model.lin.weight)


def test_copy_weights_to_device_discards_device_progress() -> None:
    model = Net()
    initial = copy.deepcopy(model.state_dict())
    training = _train(model)
    training._dirty_host_weights = False  # host keeps its stale (initial) values
    training.copyWeightsToDevice()
    torch.testing.assert_close(training._executable.device.model.lin.weight, initial["lin.weight"])


def test_inference_model_follows_training_model() -> None:
    model = Net()
    training = _train(model)
    inference = poptorch.inferenceModel(model)
    x = torch.randn(4, 3)
    out, _ = inference(x, torch.zeros(4, 2))
    torch.testing.assert_close(out, training._executable.device.model.lin(x))
    training(torch.randn(4, 3), torch.randn(4, 2))
    out, _ = inference(x, torch.zeros(4, 2))
    torch.testing.assert_close(out, training._executable.device.model.lin(x))


def test_syncs_go_through_the_executors_copy_weights_to_host() -> None:
    """A program that replaces ``copyWeightsToHost`` on its training model (PopTorch's own tests
    count downloads that way) sees every download a sync makes: the one an inference model of
    the same module triggers, and the one a host access triggers."""
    model = Net()
    training = _train(model)
    calls = [0]
    original = training.copyWeightsToHost

    def counting() -> None:
        calls[0] += 1
        original()

    training.copyWeightsToHost = counting
    inference = poptorch.inferenceModel(model)
    x = torch.randn(4, 3)
    out, _ = inference(x, torch.zeros(4, 2))
    assert calls[0] == 1
    torch.testing.assert_close(out, model.lin(x))
    training(torch.randn(4, 3), torch.randn(4, 2))
    _ = model.lin.weight + 1
    assert calls[0] == 2


def test_inference_model_does_not_see_host_changes_until_copy() -> None:
    model = nn.Linear(2, 2)
    inference = poptorch.inferenceModel(model)
    x = torch.ones(1, 2)
    first = inference(x)
    with torch.no_grad():
        model.weight.add_(1.0)
    torch.testing.assert_close(inference(x), first)
    inference.copyWeightsToDevice()
    torch.testing.assert_close(inference(x), model(x))


def test_torch_save_of_wrapped_model_loads_without_wrapper() -> None:
    model = Net()
    _train(model)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert type(loaded["lin.weight"]) is torch.Tensor or type(loaded["lin.weight"]) is nn.Parameter
    torch.testing.assert_close(loaded["lin.weight"], model.lin.weight.detach())


def test_destroy_unwraps_and_allows_rewrapping() -> None:
    model = Net()
    training = _train(model)
    assert weights.is_wrapped(model)
    with pytest.raises(RuntimeError, match="Model has already been wrapped"):
        poptorch.trainingModel(model)
    training.destroy()
    assert not weights.is_wrapped(model) and type(model) is Net
    assert type(model.lin.weight) is nn.Parameter
    again = _train(model)
    assert again.isCompiled()


def test_a_model_stays_wrapped_after_its_executor_is_dropped() -> None:
    # PopTorch checks the model's class, not the executor: re-wrapping needs model.destroy().
    model = Net()
    training = _train(model)
    del training
    gc.collect()
    assert weights.is_wrapped(model)
    with pytest.raises(RuntimeError, match=r"Call model.destroy\(\) on the model"):
        poptorch.trainingModel(model)
    model.destroy()
    assert type(model) is Net and type(model.lin.weight) is nn.Parameter
    assert _train(model).isCompiled()


def test_per_replica_buffers_without_broadcast() -> None:
    model = Net()
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(False)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training(torch.randn(4, 3), torch.randn(4, 2))
    training(torch.randn(4, 3), torch.randn(4, 2))
    # Each replica ran two micro-batches: both counters read 2, not 4.
    assert model.steps.item() == 2


def test_broadcast_buffer_update_with_replicas_is_an_error() -> None:
    model = Net()
    opts = poptorch.Options().replicationFactor(2)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="PopTorch does not support broadcasting buffers"):
        training(torch.randn(4, 3), torch.randn(4, 2))


@pytest.mark.filterwarnings("ignore:.*weight_norm.*deprecated:FutureWarning")
def test_weight_norm_model_is_copied_and_trained_like_eager() -> None:
    # weight_norm keeps a computed (non-leaf) ``weight`` that copy.deepcopy refuses.
    class Normed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.utils.weight_norm(nn.Linear(4, 3))

        def forward(self, x: torch.Tensor, y: torch.Tensor):
            out = self.fc(x)
            return out, nn.functional.mse_loss(out, y)

    model = Normed()
    eager = copy.deepcopy(model.state_dict())
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    for _ in range(3):
        training(x, y)
    ours = copy.deepcopy(model.state_dict())
    training.destroy()
    model.load_state_dict(eager)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.mse_loss(model.fc(x), y).backward()
        optimizer.step()
    assert not torch.equal(ours["fc.weight_v"], eager["fc.weight_v"])
    torch.testing.assert_close(ours, model.state_dict())


def test_unwrap_and_rewrap_model_if_necessary() -> None:
    # optimum-graphcore unwraps a training-wrapped model's tensors around deep copies and saves.
    model = Net()
    training = _train(model)
    device_weight = training._executable.device.model.lin.weight.detach().clone()
    poptorch._impl.unwrapModelIfNecessary(model)
    assert type(model.lin.weight) is nn.Parameter and weights.is_wrapped(model)
    torch.testing.assert_close(model.lin.weight.detach(), device_weight)  # synced first
    copied = copy.deepcopy(model.lin)
    torch.testing.assert_close(copied.weight.detach(), device_weight)
    poptorch._impl.rewrapModelIfNecessary(model)
    assert weights.is_wrapped(model.lin.weight)
    training(torch.randn(4, 3), torch.randn(4, 2))
    assert training._link.dirty_host_weights
    torch.testing.assert_close(  # the next host access syncs again
        model.lin.weight.detach(), training._executable.device.model.lin.weight.detach()
    )
    plain = Net()
    poptorch._impl.unwrapModelIfNecessary(plain)  # not wrapped: nothing to do
    poptorch._impl.rewrapModelIfNecessary(plain)
    assert type(plain.lin.weight) is nn.Parameter
