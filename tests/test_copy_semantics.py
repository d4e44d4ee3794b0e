"""PopTorch's copy semantics: a shallow copy at wrap time; only parameters and buffers are device state.

See [Note: what the device copies] in poptorch_sim/executor/device_tree.py.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch


class WithOptionalLoss(nn.Module):
    """PopTorch's user-guide ``trainingModel.py`` model: the loss only in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 10)
        self.loss = nn.MSELoss()

    def forward(
        self, x: torch.Tensor, target: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        fc = self.fc(x)
        if self.training:
            return fc, self.loss(fc, target)
        return fc


def test_inference_model_keeps_the_mode_it_was_wrapped_in() -> None:
    # The model's top-level attributes are a snapshot taken by inferenceModel (copy.copy).
    model = WithOptionalLoss()
    model.eval()
    inference = poptorch.inferenceModel(model)
    model.train()
    x = torch.randn(4, 10)
    out = inference(x)  # would need a target if it ran in training mode
    torch.testing.assert_close(out, model.fc(x))
    assert model.training  # the user's model is not changed by the wrapper


def test_training_model_keeps_training_mode_after_eval() -> None:
    model = WithOptionalLoss()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    model.eval()
    x, target = torch.randn(2, 10), torch.randn(2, 10)
    out, loss = training(x, target)
    assert out.shape == (2, 10) and loss.dim() == 0


class _Trainer:
    """Stands for a Lightning trainer: which step the module runs depends on its stage."""

    def __init__(self) -> None:
        self.stage = "train"


class StepModule(nn.Module):
    """Like a LightningModule: a live trainer, a mappingproxy, and a ``__getstate__`` that drops
    the trainer (so a pickled or deep-copied module loses it)."""

    def __init__(self, trainer: _Trainer) -> None:
        super().__init__()
        self._trainer = trainer
        self.hparams_view = types.MappingProxyType({"lr": 0.1})
        self.layer = nn.Linear(6, 3)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_trainer"] = None
        return state

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.layer(x)
        if self._trainer.stage == "train":
            return out, nn.functional.cross_entropy(out, y)
        return out, (out.argmax(-1) == y).float().mean()


def test_attributes_that_cannot_be_copied_are_shared() -> None:
    trainer = _Trainer()
    model = StepModule(trainer)
    with pytest.raises(TypeError):
        copy.deepcopy(model)  # what a deep copy of the model would do
    start = copy.deepcopy(model.layer.state_dict())
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(3):
        training(x, y)
    trained = copy.deepcopy(model.layer.state_dict())
    training.destroy()

    model.layer.load_state_dict(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        train_reference(model, optimizer, (x, y), 1, 1, 1)
    torch.testing.assert_close(trained, model.layer.state_dict())


def test_the_device_sees_the_live_trainer() -> None:
    trainer = _Trainer()
    model = StepModule(trainer)
    trainer.stage = "validate"
    inference = poptorch.inferenceModel(model)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    out, accuracy = inference(x, y)
    eager_out = model.layer(x)
    torch.testing.assert_close(out, eager_out)
    torch.testing.assert_close(accuracy, (eager_out.argmax(-1) == y).float().mean())


class LearnedScaleLoss(nn.Module):
    """A loss with a trainable parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out * self.scale, y)


class LossInClosure(nn.Module):
    """The loss module is reached through a function held as an attribute (a closure)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.criterion = LearnedScaleLoss()
        criterion = self.criterion
        self.loss_fn = lambda out, y: criterion(out, y)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc(x)
        return out, self.loss_fn(out, y)


def test_a_loss_module_in_a_closure_is_trained_like_eager() -> None:
    model = LossInClosure()
    start = copy.deepcopy(model.state_dict())
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    for _ in range(3):
        training(x, y)
    ours = copy.deepcopy(model.state_dict())
    training.destroy()
    model.load_state_dict(start)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        train_reference(model, optimizer, (x, y), 1, 1, 1)
    assert not torch.equal(ours["criterion.scale"], start["criterion.scale"])
    torch.testing.assert_close(ours, model.state_dict())


def test_submodules_and_hooks_are_the_users_but_weights_are_the_devices() -> None:
    model = WithOptionalLoss()
    calls: list[int] = []
    model.fc.register_forward_hook(lambda module, args, out: calls.append(1))
    inference = poptorch.inferenceModel(model)
    x, target = torch.randn(2, 10), torch.randn(2, 10)
    expected = model(x, target)[0]
    calls.clear()
    out = inference(x, target)[0]
    torch.testing.assert_close(out, expected)
    assert calls, "the user's forward hook did not run on the device"
    with torch.no_grad():
        model.fc.weight.zero_()  # host changes are not seen until copyWeightsToDevice
    torch.testing.assert_close(inference(x, target)[0], expected)
    inference.copyWeightsToDevice()
    torch.testing.assert_close(inference(x, target)[0], model(x, target)[0])
