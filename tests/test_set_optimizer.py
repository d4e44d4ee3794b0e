"""``setOptimizer`` after compilation, as PopTorch takes the changes: a variable momentum that
starts at 0, group attributes the first snapshot did not know (ignored, with PopTorch's
warning, once), and extra attributes (``optimizers_test::test_extra_attributes``); weights
against eager ``torch.optim`` with the same changes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l0, self.l1 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.l1(torch.relu(self.l0(x)))
        return out, nn.functional.cross_entropy(out, y)


X, Y = torch.randn(8, 4), torch.randint(0, 3, (8,))


def _eager_step(net: Net, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    net(X, Y)[1].backward()
    opt.step()


def _same_weights(model: Net, reference: Net) -> None:
    for name, value in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), value, msg=name)


def test_rmsprop_momentum_passed_as_zero_can_grow_after_compilation() -> None:
    # momentum=0.0 passed explicitly is variable (PopTorch), so setOptimizer may raise it; the
    # momentum buffer starts from zeros when it is first used, as torch's does.
    net = Net()
    reference = copy.deepcopy(net)
    opt = poptorch.optim.RMSprop(net.parameters(), lr=0.01, momentum=0.0)
    training = poptorch.trainingModel(net, optimizer=opt)
    ref_opt = torch.optim.RMSprop(reference.parameters(), lr=0.01, momentum=0.0)
    for _ in range(2):
        training(X, Y)
        _eager_step(reference, ref_opt)
    training.setOptimizer(poptorch.optim.RMSprop(net.parameters(), lr=0.01, momentum=0.5))
    for p in reference.parameters():
        ref_opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    ref_opt.param_groups[0]["momentum"] = 0.5
    for _ in range(3):
        training(X, Y)
        _eager_step(reference, ref_opt)
    _same_weights(net, reference)


@pytest.mark.parametrize("combined", [True, False], ids=["SGD1", "SGD2"])
def test_a_group_attribute_the_first_snapshot_did_not_know_is_ignored(
    combined: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    # optimizers_test::test_variable_groups: SGD2 has no velocity_scaling group attribute, so
    # group 1's new one is reported and ignored (and so is group 0's loss_scaling); SGD1 passed
    # velocity_scaling explicitly: it is variable, and group 1 now scales by 4.
    net = Net()
    reference = copy.deepcopy(net)
    groups = [{"params": net.l0.parameters()}, {"params": net.l1.parameters()}]
    scaling = 2.0 if combined else None
    opt = poptorch.optim.SGD(
        groups, lr=0.05, loss_scaling=2.0, velocity_scaling=scaling, use_combined_accum=combined
    )
    training = poptorch.trainingModel(net, optimizer=opt)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    training(X, Y)
    _eager_step(reference, ref_opt)
    opt.loss_scaling = 4.0
    opt.param_groups[1]["velocity_scaling"] = 4.0
    opt.param_groups[0]["loss_scaling"] = 4.0  # not a group attribute
    training.setOptimizer(opt)
    for _ in range(2):
        training(X, Y)
        _eager_step(reference, ref_opt)
    err = capsys.readouterr().err
    variant = "SGD1" if combined else "SGD2"
    assert f"Ignoring unexpected group 0 attribute in {variant} optimizer: ['loss_scaling']" in err
    ignored = f"Ignoring unexpected group 1 attribute in {variant} optimizer: ['velocity_scaling']"
    assert (ignored in err) != combined
    snap = training._optim._snapshot
    assert snap.groups[1].values["velocity_scaling"] == (4.0 if combined else 1.0)
    _same_weights(net, reference)  # without momentum, velocity scaling changes no weight


def _two_group_sgd(net: Net, combined: bool) -> poptorch.optim.SGD:
    groups = [{"params": net.l0.parameters()}, {"params": net.l1.parameters()}]
    return poptorch.optim.SGD(
        groups,
        lr=0.01,
        loss_scaling=2.0,
        velocity_scaling=2.0 if combined else None,
        use_combined_accum=combined,
    )


@pytest.mark.parametrize("combined", [True, False], ids=["SGD1", "SGD2"])
def test_extra_attributes_warn_once(combined: bool, capsys: pytest.CaptureFixture[str]) -> None:
    # optimizers_test::test_extra_attributes
    net = Net()
    opt = _two_group_sgd(net, combined)
    training = poptorch.trainingModel(net, optimizer=opt)
    training(X, Y)
    opt.step = 0
    opt.param_groups[0]["initial_lr"] = 0.1
    opt.param_groups[1]["initial_lr"] = 0.1
    training.setOptimizer(opt)
    training(X, Y)
    err = capsys.readouterr().err
    assert "unexpected optimizer attribute" in err and "['step']" in err
    assert "unexpected group 0 attribute" in err and "unexpected group 1 attribute" in err
    opt.loss_scaling = 3.0  # a different optimizer, so that it is taken again
    training.setOptimizer(opt)
    training(X, Y)
    assert "unexpected" not in capsys.readouterr().err  # given once per model


@pytest.mark.parametrize("combined", [True, False], ids=["SGD1", "SGD2"])
def test_relaxed_checks_say_nothing(combined: bool, capsys: pytest.CaptureFixture[str]) -> None:
    # optimizers_test::test_extra_attributes2
    net = Net()
    opt = _two_group_sgd(net, combined)
    options = poptorch.Options().relaxOptimizerAttributesChecks()
    training = poptorch.trainingModel(net, options, optimizer=opt)
    training(X, Y)
    opt.step = 0
    opt.param_groups[0]["initial_lr"] = 0.1
    training.setOptimizer(opt)
    training(X, Y)
    assert "unexpected" not in capsys.readouterr().err


def test_extra_attributes_before_wrapping_are_expected(capsys: pytest.CaptureFixture[str]) -> None:
    # optimizers_test::test_extra_attributes3
    net = Net()
    opt = _two_group_sgd(net, False)
    opt.step = 0
    opt.param_groups[0]["initial_lr"] = 0.1
    opt.param_groups[1]["initial_lr"] = 0.1
    training = poptorch.trainingModel(net, optimizer=opt)
    training(X, Y)
    assert "unexpected" not in capsys.readouterr().err
    opt.loss_scaling = 4.0
    opt.initial_lr = 0.2  # an optimizer attribute now: reported
    training.setOptimizer(opt)
    training(X, Y)
    err = capsys.readouterr().err
    assert "unexpected optimizer attribute" in err and "initial_lr" in err
    assert "unexpected group" not in err
