"""Tests for poptorch_sim.optim: PopTorch's optimizers, snapshots and the device optimizer."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import pickle

import pytest
import torch
from torch.testing import assert_close

from poptorch_sim.errors import Error
from poptorch_sim.optim import LAMB, SGD, Adam, AdamW, Optimizer, RMSprop, VariableAttributes
from poptorch_sim.optim.device.fused import FusedOptimizer
from poptorch_sim.optim.device.ipu_state import export_state, import_state
from poptorch_sim.optim.device.replacement import check_update
from poptorch_sim.optim.device.snapshot import OptimizerSnapshot, snapshot
from poptorch_sim.optim.device.torch_optimizer import (
    apply_hyperparameters,
    device_groups,
    device_optimizer,
    prepare_gradients_,
    restore_groups_,
)
from poptorch_sim.optim.variants import AdamWNoBias, RMSpropTF

POPTORCH_CLASSES = [SGD, Adam, AdamW, RMSprop, LAMB]


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _groups(model: torch.nn.Module, **second) -> list[dict]:
    return [{"params": model[0].parameters()}, {"params": model[2].parameters(), **second}]


# --------------------------------------------------------------------------- signatures


EXPECTED_SIGNATURES = {
    SGD: "params lr momentum dampening weight_decay nesterov maximize foreach differentiable "
    "loss_scaling velocity_scaling use_combined_accum accum_type velocity_accum_type "
    "max_grad_norm",
    Adam: "params lr betas eps weight_decay amsgrad foreach maximize capturable differentiable "
    "fused loss_scaling accum_type first_order_momentum_accum_type "
    "second_order_momentum_accum_type max_grad_norm",
    AdamW: "params lr betas eps weight_decay amsgrad maximize foreach capturable differentiable "
    "fused loss_scaling bias_correction accum_type first_order_momentum_accum_type "
    "second_order_momentum_accum_type max_grad_norm",
    RMSprop: "params lr alpha eps weight_decay momentum centered foreach maximize differentiable "
    "loss_scaling accum_type first_order_momentum_accum_type "
    "second_order_momentum_accum_type use_tf_variant",
    LAMB: "params lr betas eps weight_decay bias_correction loss_scaling max_weight_norm "
    "accum_type first_order_momentum_accum_type second_order_momentum_accum_type",
}


@pytest.mark.parametrize("cls", POPTORCH_CLASSES, ids=lambda c: c.__name__)
def test_signature_matches_poptorch(cls):
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == EXPECTED_SIGNATURES[cls].split()
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    assert required == (["params", "lr"] if cls is SGD else ["params"])
    assert all(p.default is None for p in params if p.name not in required)
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


@pytest.mark.parametrize(
    "cls, base",
    [
        (SGD, torch.optim.SGD),
        (Adam, torch.optim.Adam),
        (AdamW, torch.optim.AdamW),
        (RMSprop, torch.optim.RMSprop),
        (LAMB, torch.optim.Optimizer),
    ],
    ids=lambda c: c.__name__,
)
def test_classes_subclass_torch(cls, base):
    assert cls.__bases__ == (Optimizer, base)


def test_positional_arguments_follow_torch_order():
    model = _model()
    opt = SGD(model.parameters(), 0.1, 0.9, 0.0, 0.01, True)
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]) == (
        0.1,
        0.9,
        0.01,
        True,
    )


# --------------------------------------------------------------------------- defaults


@pytest.mark.parametrize(
    "cls, extras",
    [
        (SGD, {"use_combined_accum": False, "velocity_accum_type": torch.float32}),
        (Adam, {"first_order_momentum_accum_type": torch.float32}),
        (AdamW, {"bias_correction": True, "second_order_momentum_accum_type": torch.float32}),
        (RMSprop, {"use_tf_variant": False}),
        (LAMB, {"bias_correction": True, "max_weight_norm": 65500.0}),
    ],
    ids=lambda c: getattr(c, "__name__", ""),
)
def test_extra_argument_defaults(cls, extras):
    opt = cls(_model().parameters(), lr=0.01)
    assert opt.loss_scaling == 1.0
    assert opt.accum_type == torch.float32
    if cls in (SGD, Adam, AdamW):
        assert opt.max_grad_norm == math.inf
    for name, value in extras.items():
        assert getattr(opt, name) == value


@pytest.mark.parametrize(
    "cls, torch_cls",
    [(Adam, torch.optim.Adam), (AdamW, torch.optim.AdamW), (RMSprop, torch.optim.RMSprop)],
    ids=lambda c: c.__name__,
)
def test_group_defaults_are_torchs(cls, torch_cls):
    ours = cls(_model().parameters()).defaults
    theirs = torch_cls(_model().parameters()).defaults
    for key in ("lr", "eps", "weight_decay"):
        assert ours[key] == theirs[key]


def test_lamb_defaults():
    opt = LAMB(_model().parameters())
    assert opt.defaults == {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 1e-2,
        "max_weight_norm": 65500.0,
    }


def test_combined_sgd_puts_velocity_scaling_in_groups():
    model = _model()
    opt = SGD(_groups(model, velocity_scaling=4.0), lr=0.1, use_combined_accum=True,
              velocity_scaling=2.0)  # fmt: skip
    assert [g["velocity_scaling"] for g in opt.param_groups] == [2.0, 4.0]
    assert opt.defaults["velocity_scaling"] == 2.0


def test_separate_sgd_warns_about_velocity_scaling(capsys):
    opt = SGD(_model().parameters(), lr=0.1, velocity_scaling=2.0)
    assert "velocity_scaling value ignored when using the separate variant" in (
        capsys.readouterr().err
    )
    assert "velocity_scaling" not in opt.param_groups[0]


# --------------------------------------------------------------------------- variable attributes


@pytest.mark.parametrize("cls", POPTORCH_CLASSES, ids=lambda c: c.__name__)
def test_explicit_arguments_are_variable(cls):
    opt = cls(_model().parameters(), lr=0.01, weight_decay=0.1, loss_scaling=2.0)
    assert not opt.variable_attrs.isConstant("lr")
    assert not opt.variable_attrs.isConstant("weight_decay")
    assert not opt.variable_attrs.isConstant("loss_scaling")
    assert opt.variable_attrs.isConstant("eps" if cls is not SGD else "momentum")


def test_mark_as_constant_and_variable():
    opt = Adam(_model().parameters(), lr=0.01)
    opt.variable_attrs.markAsConstant("lr")
    opt.variable_attrs.markAsVariable("eps")
    opt.variable_attrs.markAsVariable("eps")
    assert opt.variable_attrs.isConstant("lr")
    assert not opt.variable_attrs.isConstant("eps")
    opt.variable_attrs.markAsConstant("eps")
    assert opt.variable_attrs.isConstant("eps")


@pytest.mark.parametrize("method", ["markAsConstant", "markAsVariable"])
def test_unknown_attribute_is_an_assertion_error(method):
    opt = SGD(_model().parameters(), lr=0.01)
    with pytest.raises(AssertionError, match=r"Unknown attribute betas, allowed values: \["):
        getattr(opt.variable_attrs, method)("betas")


def test_variable_attrs_repr_and_type():
    opt = LAMB(_model().parameters(), lr=0.1)
    assert isinstance(opt.variable_attrs, VariableAttributes)
    assert "lr" in repr(opt.variable_attrs)


@pytest.mark.parametrize(
    "cls, arg",
    [
        (SGD, "accum_type"),
        (SGD, "velocity_accum_type"),
        (Adam, "first_order_momentum_accum_type"),
        (AdamW, "second_order_momentum_accum_type"),
        (RMSprop, "accum_type"),
        (LAMB, "first_order_momentum_accum_type"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_bad_accumulation_type(cls, arg):
    with pytest.raises(
        AssertionError, match="Accumulation types must be either torch.float32 or torch.float16"
    ):
        cls(_model().parameters(), lr=0.1, **{arg: torch.bfloat16})


def test_half_accumulation_types_are_accepted():
    opt = AdamW(_model().parameters(), accum_type=torch.float16, loss_scaling=1024)
    assert opt.accum_type == torch.float16
    assert snapshot(opt).requires_running_mean_reduction


# --------------------------------------------------------------------------- state dict


@pytest.mark.parametrize("cls", POPTORCH_CLASSES, ids=lambda c: c.__name__)
def test_state_dict_before_compilation_is_empty(cls):
    opt = cls(_model().parameters(), lr=0.1)
    state = opt.state_dict()
    assert state["ipu_state"] is None and state["ipu_param"] is None
    assert set(state) == {"ipu_state", "ipu_param", "state", "param_groups"}
    assert not opt.has_state()
    assert not opt.ipu_state_is_dirty and not opt.host_state_is_dirty


def test_load_torch_state_dict_is_refused():
    model = _model()
    torch_state = torch.optim.SGD(model.parameters(), lr=0.1).state_dict()
    opt = SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        RuntimeError, match="Only IPU optimizer states can be loaded onto the IPU."
    ):
        opt.load_state_dict(torch_state)


def test_load_empty_state_dict_is_refused():
    opt = SGD(_model().parameters(), lr=0.1)
    with pytest.raises(
        RuntimeError, match="Cannot load optimizer state dictionary because it is empty."
    ):
        opt.load_state_dict({})


def _ipu_state() -> tuple[dict, dict]:
    return (
        {"Accl1___0.weight": torch.ones(3, 4)},
        {"learningRate___specific___0.weight": torch.tensor(0.5)},
    )


def test_state_round_trip_through_executor_hooks():
    model = _model()
    opt = Adam(model.parameters(), lr=0.1)
    reads = []

    def reader():
        reads.append(1)
        return _ipu_state()

    opt._set_state_reader(reader)
    opt.host_state_is_dirty = True  # the executor ran a step
    state = opt.state_dict()
    assert len(reads) == 1 and opt.has_state() and not opt.host_state_is_dirty
    assert_close(state["ipu_state"]["Accl1___0.weight"], torch.ones(3, 4))
    opt.state_dict()  # cached: no second read
    assert len(reads) == 1

    other = Adam(model.parameters(), lr=0.2)
    other.load_state_dict(state)
    assert other.ipu_state_is_dirty and not other.host_state_is_dirty and other.has_state()
    assert other.param_groups[0]["lr"] == 0.1  # torch's part loaded too (LR schedulers)
    written = other.get_state_dict()
    assert_close(written["ipu_param"], state["ipu_param"])


def test_set_ipu_state_leaves_both_sides_clean():
    opt = RMSprop(_model().parameters())
    opt.ipu_state_is_dirty = True
    opt._set_ipu_state(*_ipu_state())
    assert opt.has_state() and not opt.ipu_state_is_dirty and not opt.host_state_is_dirty


@pytest.mark.parametrize(
    "copier",
    [copy.copy, copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_copies_keep_poptorch_attributes(copier):
    opt = AdamW(_model().parameters(), lr=0.1, loss_scaling=8.0, bias_correction=False)
    opt._set_state_reader(_ipu_state)
    opt._set_ipu_state(*_ipu_state())
    clone = copier(opt)
    assert clone.loss_scaling == 8.0 and clone.bias_correction is False
    assert not clone.variable_attrs.isConstant("loss_scaling")
    assert clone.ipu_state_is_dirty  # the next executor must write the state
    assert clone._state_reader is None


# --------------------------------------------------------------------------- snapshot


@pytest.mark.parametrize(
    "make, kind, variant",
    [
        (lambda p: SGD(p, lr=0.1), "sgd", "SGD2"),
        (lambda p: SGD(p, lr=0.1, use_combined_accum=True), "sgd", "SGD1"),
        (lambda p: torch.optim.SGD(p, lr=0.1), "sgd", "SGD2"),
        (lambda p: Adam(p), "adam", "ADAM"),
        (lambda p: torch.optim.Adam(p), "adam", "ADAM"),
        (lambda p: torch.optim.Adam(p, decoupled_weight_decay=True), "adamw", "ADAMW"),
        (lambda p: AdamW(p), "adamw", "ADAMW"),
        (lambda p: AdamW(p, bias_correction=False), "adamw", "ADAMW_NO_BIAS"),
        (lambda p: torch.optim.AdamW(p), "adamw", "ADAMW"),
        (lambda p: RMSprop(p), "rmsprop", "RMSPROP"),
        (lambda p: torch.optim.RMSprop(p, centered=True), "rmsprop", "RMSPROP_CENTERED"),
        (lambda p: LAMB(p), "lamb", "LAMB"),
        (lambda p: LAMB(p, bias_correction=False), "lamb", "LAMB_NO_BIAS"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_snapshot_kind_and_variant(make, kind, variant):
    snap = snapshot(make(_model().parameters()))
    assert (snap.kind, snap.variant) == (kind, variant)


def test_snapshot_records_groups_as_indices():
    model = _model()
    params = list(model.parameters())
    opt = torch.optim.SGD(
        [{"params": [params[2], params[3]], "lr": 0.5}, {"params": [params[0], params[1]]}],
        lr=0.1,
        momentum=0.9,
    )
    snap = snapshot(opt, params)
    assert [g.params for g in snap.groups] == [(2, 3), (0, 1)]
    assert [g.values["lr"] for g in snap.groups] == [0.5, 0.1]
    assert snap.num_params == 4
    assert [g.params for g in snapshot(opt).groups] == [(0, 1), (2, 3)]


def test_snapshot_of_foreign_tensor_is_an_error():
    model = _model()
    opt = torch.optim.SGD([*model.parameters(), torch.nn.Parameter(torch.ones(7))], lr=0.1)
    with pytest.raises(Error, match=r"group 0 holds 1 tensor\(s\) that are not parameters"):
        snapshot(opt, list(model.parameters()))


def test_snapshot_is_frozen_and_ignores_later_edits():
    opt = SGD(_model().parameters(), lr=0.1, loss_scaling=2.0)
    snap = snapshot(opt)
    opt.param_groups[0]["lr"] = 0.5
    opt.loss_scaling = 4.0
    assert snap.groups[0].values["lr"] == 0.1 and snap.loss_scaling == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.kind = "adam"  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.groups[0].values["lr"] = 1.0  # type: ignore[index]


def test_torch_optimizer_constness_follows_defaults():
    opt = torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)
    snap = snapshot(opt)
    assert not snap.is_constant("lr", 0)
    assert not snap.is_constant("momentum", 0)
    assert snap.is_constant("dampening", 0) and snap.is_constant("weight_decay", 0)
    assert snap.is_constant("nesterov", 0)
    assert snap.is_constant("loss_scaling") and snap.loss_scaling == 1.0
    assert snap.max_grad_norm == math.inf


def test_torch_adamw_default_weight_decay_is_constant():
    assert snapshot(torch.optim.AdamW(_model().parameters())).is_constant("weight_decay", 0)
    snap = snapshot(torch.optim.AdamW(_model().parameters(), weight_decay=0.0))
    assert not snap.is_constant("weight_decay", 0)
    assert snapshot(torch.optim.Adam(_model().parameters())).is_constant("betas", 0)


def test_poptorch_constness_follows_variable_attrs():
    opt = Adam(_model().parameters(), betas=(0.8, 0.9))
    opt.variable_attrs.markAsVariable("eps")
    snap = snapshot(opt)
    assert snap.is_constant("lr", 0)  # not passed explicitly
    assert not snap.is_constant("betas", 0) and not snap.is_constant("eps")


def test_auto_loss_scaling_makes_loss_scaling_variable():
    opt = SGD(_model().parameters(), lr=0.1)
    assert snapshot(opt).is_constant("loss_scaling")
    assert not snapshot(opt, auto_loss_scaling=True).is_constant("loss_scaling")
    assert not opt.variable_attrs.isConstant("loss_scaling")
    torch_opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    assert not snapshot(torch_opt, auto_loss_scaling=True).is_constant("loss_scaling")


def test_max_grad_norm_and_loss_scaling_are_read():
    snap = snapshot(Adam(_model().parameters(), loss_scaling=64.0, max_grad_norm=2.0))
    assert (snap.loss_scaling, snap.max_grad_norm) == (64.0, 2.0)
    torch_opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    torch_opt.max_grad_norm = 3.0
    assert snapshot(torch_opt).max_grad_norm == 3.0


def test_unsupported_optimizer_type():
    opt = torch.optim.Adagrad(_model().parameters())
    with pytest.raises(AssertionError, match=r"Unsupported optimizer type. Types supported.*"
                       r"poptorch.optim.LAMB.*torch.optim.RMSprop.*got torch.optim.adagrad.Adagrad"):  # fmt: skip
        snapshot(opt)


def test_subclass_warns(capsys):
    class MySGD(torch.optim.SGD):
        pass

    snap = snapshot(MySGD(_model().parameters(), lr=0.1))
    assert snap.kind == "sgd"
    err = capsys.readouterr().err
    assert "Optimizer `MySGD` subclassed from classes in poptorch.optim or torch.optim" in err
    assert "Poptorch does not run Python optimizer code directly" in err
    snapshot(torch.optim.AdamW(_model().parameters()))  # AdamW subclasses Adam in torch 2.14
    snapshot(AdamW(_model().parameters()))
    assert "subclassed" not in capsys.readouterr().err


@pytest.mark.parametrize("cls", [Adam, AdamW, torch.optim.Adam, torch.optim.AdamW],
                         ids=lambda c: f"{c.__module__.split('.')[0]}.{c.__name__}")  # fmt: skip
def test_amsgrad_is_refused(cls):
    opt = cls(_model().parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="Only non-amsgrad Adam/AdamW optimizers are supported."):
        snapshot(opt)


def test_rmsprop_groups_must_share_centered():
    model = _model()
    opt = RMSprop(_groups(model, centered=True), centered=False)
    with pytest.raises(
        AssertionError,
        match=r"All parameter groups must have the same value for the 'centered' attribute "
        r"\(Group 0: False / Group 1: True\)",
    ):
        snapshot(opt)


def test_bad_hyperparameter_values():
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    opt.param_groups[0]["momentum"] = "fast"
    with pytest.raises(AssertionError, match="Expected a number for momentum but got 'fast'"):
        snapshot(opt)
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    opt.accum_type = torch.int32
    with pytest.raises(ValueError, match="accum_type must be set to either torch.float16"):
        snapshot(opt)
    opt = Adam(_model().parameters(), max_grad_norm=float("nan"))
    with pytest.raises(ValueError, match="max_grad_norm must not be NaN"):
        snapshot(opt)


def test_tensor_learning_rate_becomes_a_float():
    opt = torch.optim.Adam(_model().parameters(), lr=torch.tensor(0.02))
    assert snapshot(opt).groups[0].values["lr"] == pytest.approx(0.02)


def test_unexpected_attributes_are_reported(capsys):
    model = _model()
    opt = SGD(_groups(model), lr=0.01, loss_scaling=2.0)
    first = snapshot(opt)
    assert "Ignoring" not in capsys.readouterr().err
    opt.param_groups[0]["loss_scaling"] = 4.0
    opt.lr = 0.5
    second = snapshot(opt, previous=first)
    err = capsys.readouterr().err
    assert "Ignoring unexpected group 0 attribute in SGD2 optimizer: ['loss_scaling']" in err
    assert "Ignoring unexpected optimizer attribute in SGD2 optimizer: ['lr']" in err
    assert "group 1" not in err
    assert second.known_group_attrs == first.known_group_attrs
    snapshot(opt, previous=first, relax_checks=True)
    assert "Ignoring" not in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:Detected call of")
def test_lr_scheduler_attributes_are_expected_when_it_is_made_first(capsys):
    opt = SGD(_model().parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    first = snapshot(opt)
    scheduler.step()
    new = snapshot(opt, previous=first)
    assert "Ignoring" not in capsys.readouterr().err
    assert new.groups[0].values["lr"] == pytest.approx(0.05)


@pytest.mark.filterwarnings("ignore:Detected call of")
def test_lr_scheduler_made_after_the_first_snapshot_is_reported_as_poptorch_does(capsys):
    # PopTorch's OptimizerAttrTracker reports the attributes a scheduler adds after wrapping
    # (``initial_lr`` in each group, ``step`` on the optimizer); the learning rate still follows.
    opt = SGD(_model().parameters(), lr=0.1)
    first = snapshot(opt)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scheduler.step()
    new = snapshot(opt, previous=first)
    err = capsys.readouterr().err
    assert "Ignoring unexpected group 0 attribute in SGD2 optimizer: ['initial_lr']" in err
    assert new.groups[0].values["lr"] == pytest.approx(0.05)


# --------------------------------------------------------------------------- check_update


def test_changing_variable_attributes_is_allowed():
    opt = SGD(_model().parameters(), lr=0.1, momentum=0.9, loss_scaling=2.0)
    old = snapshot(opt)
    opt.param_groups[0]["lr"] = 0.05
    opt.param_groups[0]["momentum"] = 0.5
    opt.loss_scaling = 8.0
    check_update(old, snapshot(opt, previous=old))


@pytest.mark.parametrize(
    "attr, before, after",
    [("momentum", 0, 0.9), ("dampening", 0, 0.5)],
)
def test_changing_a_constant_attribute_is_an_error(attr, before, after):
    opt = SGD(_model().parameters(), lr=0.1, momentum=0.9 if attr == "dampening" else None)
    old = snapshot(opt)
    opt.param_groups[0][attr] = after
    with pytest.raises(
        Error,
        match=rf"Trying to modify a constant attribute after the model has been compiled: "
        rf"'{attr}' of group 0 changed from {before} to {after}",
    ):
        check_update(old, snapshot(opt, previous=old))


def test_changing_constant_loss_scaling_is_an_error():
    opt = Adam(_model().parameters(), lr=0.1)
    old = snapshot(opt)
    opt.loss_scaling = 128.0
    with pytest.raises(Error, match=r"'loss_scaling' changed from 1.0 to 128.0"):
        check_update(old, snapshot(opt))


def test_torch_constant_becoming_variable_is_an_error():
    opt = torch.optim.SGD(_model().parameters(), lr=0.1)
    old = snapshot(opt)
    opt.param_groups[0]["momentum"] = 0.9
    with pytest.raises(
        Error, match=r"'momentum' of group 0 was constant \(0\) .* variable \(0.9\)"
    ):
        check_update(old, snapshot(opt))


def test_variable_becoming_constant_is_an_error():
    model = _model()
    old = snapshot(SGD(model.parameters(), lr=0.1, momentum=0.9))
    new = snapshot(SGD(model.parameters(), lr=0.1))
    with pytest.raises(Error, match=r"'momentum' of .* was variable \(0.9\) .* constant \(0\)"):
        check_update(old, new)


def test_changing_the_optimizer_type_is_an_error():
    model = _model()
    old = snapshot(SGD(model.parameters(), lr=0.1))
    for new_opt, variant in [
        (Adam(model.parameters()), "ADAM"),
        (SGD(model.parameters(), lr=0.1, use_combined_accum=True), "SGD1"),
    ]:
        with pytest.raises(Error, match=rf"compiled with SGD \(SGD2\) .* \({variant}\)"):
            check_update(old, snapshot(new_opt))


def test_changing_the_groups_is_an_error():
    model = _model()
    params = list(model.parameters())
    old = snapshot(SGD(model.parameters(), lr=0.1), params)
    new = snapshot(SGD(_groups(model), lr=0.1), params)
    with pytest.raises(Error, match=r"compiled with 1 group\(s\) of sizes \[4\]"):
        check_update(old, new)


def test_changing_a_fixed_attribute_is_an_error():
    model = _model()
    old = snapshot(Adam(model.parameters(), lr=0.1))
    new = snapshot(Adam(model.parameters(), lr=0.1, max_grad_norm=1.0))
    with pytest.raises(Error, match=r"'max_grad_norm' changed from inf to 1.0"):
        check_update(old, new)


# --------------------------------------------------------------------------- device optimizer


def _clone_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]


def _set_grads(params, grads) -> None:
    for p, g in zip(params, grads):
        p.grad = g.clone()


def _step_both(device, params, eager, eager_params, steps: int = 2) -> None:
    """Steps ``device`` and ``eager`` ``steps`` times on the same random gradients."""
    for _ in range(steps):
        grads = [torch.randn_like(p) for p in params]
        _set_grads(params, grads)
        _set_grads(eager_params, grads)
        device.step()
        eager.step()


CASES = [
    ("sgd", SGD, torch.optim.SGD, {"lr": 0.1}),
    ("sgd-momentum", SGD, torch.optim.SGD,
     {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    ("sgd-nesterov", SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("adam", Adam, torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1, "betas": (0.8, 0.95)}),
    ("adamw", AdamW, torch.optim.AdamW, {"lr": 0.01, "eps": 1e-6}),
    ("rmsprop", RMSprop, torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "weight_decay": 0.1}),
    ("rmsprop-centered", RMSprop, torch.optim.RMSprop, {"lr": 0.01, "centered": True}),
]  # fmt: skip


@pytest.mark.parametrize("source", ["poptorch", "torch"])
@pytest.mark.parametrize("name, ours, theirs, kwargs", CASES, ids=[c[0] for c in CASES])
def test_device_optimizer_matches_torch(name, ours, theirs, kwargs, source):
    model = _model()
    reference = theirs(_groups(model, lr=0.003), **kwargs, foreach=False)
    user = (ours if source == "poptorch" else theirs)(_groups(model, lr=0.003), **kwargs)
    device_params = _clone_params(model)
    device = device_optimizer(snapshot(user, list(model.parameters())), device_params)
    for _ in range(4):
        grads = [torch.randn_like(p) for p in device_params]
        _set_grads(model.parameters(), grads)
        _set_grads(device_params, grads)
        reference.step()
        device.step()
    assert_close(device_params, [p.detach() for p in model.parameters()], rtol=0, atol=0)


def test_apply_hyperparameters_keeps_state():
    model = _model()
    reference = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    user = Adam(model.parameters(), lr=0.01)
    device_params = _clone_params(model)
    old = snapshot(user)
    device = device_optimizer(old, device_params)
    for step in range(4):
        if step == 2:
            reference.param_groups[0]["lr"] = 0.002
            user.param_groups[0]["lr"] = 0.002
            new = snapshot(user, previous=old)
            check_update(old, new)
            apply_hyperparameters(device, new)
        grads = [torch.randn_like(p) for p in device_params]
        _set_grads(model.parameters(), grads)
        _set_grads(device_params, grads)
        reference.step()
        device.step()
    assert_close(device_params, [p.detach() for p in model.parameters()], rtol=0, atol=0)
    assert device.state[device_params[0]]["step"] == 4


def test_apply_hyperparameters_group_mismatch():
    model = _model()
    device = device_optimizer(snapshot(SGD(model.parameters(), lr=0.1)), _clone_params(model))
    with pytest.raises(Error, match=r"snapshot with 2 group\(s\) to a device optimizer with 1"):
        apply_hyperparameters(device, snapshot(SGD(_groups(model), lr=0.1)))


def test_device_optimizer_needs_enough_params():
    model = _model()
    snap = snapshot(SGD(model.parameters(), lr=0.1))
    with pytest.raises(Error, match="parameter index 3 but only 2 device parameters"):
        device_optimizer(snap, _clone_params(model)[:2])


def test_device_optimizer_types():
    model = _model()
    params = _clone_params(model)
    assert isinstance(device_optimizer(snapshot(LAMB(model.parameters())), params), LAMB)
    no_bias = AdamW(model.parameters(), bias_correction=False)
    assert isinstance(device_optimizer(snapshot(no_bias), params), AdamWNoBias)
    tf = RMSprop(model.parameters(), use_tf_variant=True)
    assert isinstance(device_optimizer(snapshot(tf), params), RMSpropTF)


def test_prepare_gradients_unscales_and_clips():
    model = _model()
    params = list(model.parameters())
    grads = [torch.randn_like(p) * 10 for p in params]
    snap = snapshot(SGD(model.parameters(), lr=0.1, loss_scaling=4.0, max_grad_norm=0.5))
    _set_grads(params, grads)
    prepare_gradients_(params, snap)
    expected = _clone_params(model)
    _set_grads(expected, [g / 4.0 for g in grads])
    torch.nn.utils.clip_grad_norm_(expected, 0.5)
    assert_close([p.grad for p in params], [p.grad for p in expected])
    assert torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params])) <= 0.5 + 1e-6


def test_loss_scaling_is_numerically_neutral():
    model = _model()
    x = torch.randn(8, 4)
    scaled = copy.deepcopy(model)
    model(x).square().mean().backward()
    (scaled(x).square().mean() * 128.0).backward()
    snap = snapshot(SGD(scaled.parameters(), lr=0.1, loss_scaling=128.0))
    prepare_gradients_(list(scaled.parameters()), snap)
    assert_close([p.grad for p in scaled.parameters()], [p.grad for p in model.parameters()])


# --------------------------------------------------------------------------- LAMB and variants


def _lamb_reference(w, grads, lr, betas, eps, wd, bias_correction, max_weight_norm):
    """LAMB written from the formula, in float64."""
    w = w.double().clone()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        bc1 = 1 - betas[0] ** t if bias_correction else 1.0
        bc2 = 1 - betas[1] ** t if bias_correction else 1.0
        r = (m / bc1) / (v.sqrt() / math.sqrt(bc2) + eps) + wd * w
        w_norm = min(w.norm().item(), max_weight_norm)
        r_norm = r.norm().item()
        trust = 1.0 if w_norm == 0 or r_norm == 0 else w_norm / r_norm
        w = w - lr * trust * r
    return w


@pytest.mark.parametrize(
    "bias_correction, max_weight_norm, zero_weight",
    [(True, 65500.0, False), (False, 65500.0, False), (True, 0.5, False), (True, 65500.0, True)],
    ids=["bias", "no-bias", "clamped-norm", "zero-weights"],
)
def test_lamb_matches_reference(bias_correction, max_weight_norm, zero_weight):
    w = torch.zeros(5, 3) if zero_weight else torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(5)]
    p = torch.nn.Parameter(w.clone())
    opt = LAMB([p], lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1,
               bias_correction=bias_correction, max_weight_norm=max_weight_norm)  # fmt: skip
    for g in grads:
        p.grad = g.clone()
        opt.step()
    expected = _lamb_reference(w, grads, 0.05, (0.8, 0.99), 1e-6, 0.1, bias_correction,
                               max_weight_norm)  # fmt: skip
    assert_close(p.detach(), expected.float(), rtol=1e-5, atol=1e-6)


def test_lamb_device_optimizer_matches_host_step():
    model = _model()
    user = LAMB(_groups(model, weight_decay=0.0), lr=0.01)
    device_params = _clone_params(model)
    device = device_optimizer(snapshot(user), device_params)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in device_params]
        _set_grads(model.parameters(), grads)
        _set_grads(device_params, grads)
        user.step()
        device.step()
    assert_close(device_params, [p.detach() for p in model.parameters()], rtol=0, atol=0)


def test_lamb_step_calls_closure():
    p = torch.nn.Parameter(torch.ones(3))
    opt = LAMB([p])

    def closure():
        p.grad = torch.ones(3)
        return 7.0

    assert opt.step(closure) == 7.0
    assert not torch.equal(p.detach(), torch.ones(3))


def test_adamw_without_bias_correction_matches_formula():
    w, grads = torch.randn(4, 2), [torch.randn(4, 2) for _ in range(4)]
    p = torch.nn.Parameter(w.clone())
    opt = AdamWNoBias([p], lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    m, v, ref = torch.zeros_like(w), torch.zeros_like(w), w.double()
    for g in grads:
        p.grad = g.clone()
        opt.step()
        m = 0.9 * m + 0.1 * g.double()
        v = 0.99 * v + 0.01 * g.double() ** 2
        ref = ref - 0.01 * (m / (v.sqrt() + 1e-6) + 0.1 * ref)
    assert_close(p.detach(), ref.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("momentum, centered", [(0.0, False), (0.9, False), (0.5, True)],
                         ids=["plain", "momentum", "centered"])  # fmt: skip
def test_rmsprop_tf_variant_matches_formula(momentum, centered):
    w, grads = torch.randn(4, 2), [torch.randn(4, 2) for _ in range(4)]
    p = torch.nn.Parameter(w.clone())
    opt = RMSpropTF([p], lr=0.01, alpha=0.9, eps=1e-3, weight_decay=0.1, momentum=momentum,
                    centered=centered)  # fmt: skip
    ref, ms, mg, buf = w.double(), torch.ones(4, 2).double(), torch.zeros(4, 2).double(), 0.0
    for g in grads:
        p.grad = g.clone()
        opt.step()
        g = g.double() + 0.1 * ref
        ms = 0.9 * ms + 0.1 * g * g
        mg = 0.9 * mg + 0.1 * g
        denom = (ms - mg * mg + 1e-3).sqrt() if centered else (ms + 1e-3).sqrt()
        buf = momentum * buf + 0.01 * g / denom
        ref = ref - buf
    assert_close(p.detach(), ref.float(), rtol=1e-5, atol=1e-6)


def test_snapshot_type_is_exported():
    assert OptimizerSnapshot.__dataclass_params__.frozen


# --------------------------------------------------------------------------- PopART-named state


def _names(model: torch.nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def test_export_state_names_and_values_before_any_step():
    model = _model()
    snap = snapshot(SGD(model.parameters(), lr=0.05, weight_decay=0.025, loss_scaling=0.75))
    device = device_optimizer(snap, _clone_params(model))
    ipu_state, ipu_param = export_state(device, snap, _names(model))
    assert ipu_state == {}  # plain SGD has no state tensors
    assert_close(ipu_param["scaledLearningRate0___specific___0.bias"], torch.tensor(0.05 / 0.75))
    assert_close(ipu_param["weightDecayScaleFactor0___specific___2.weight"],
                 torch.tensor(1 - 0.05 * 0.025))  # fmt: skip
    assert_close(ipu_param["lossScaling_FLOAT"], torch.tensor(0.75))

    snap = snapshot(Adam(model.parameters(), lr=0.05, weight_decay=0.025))
    device = device_optimizer(snap, _clone_params(model))
    ipu_state, ipu_param = export_state(device, snap, _names(model))
    assert set(ipu_state) == {
        f"{p}___{n}" for p in ("Accl1", "Accl2", "Step") for n in _names(model)
    }
    assert_close(ipu_param["learningRate___specific___0.bias"], torch.tensor(0.05))
    assert_close(ipu_param["weightDecay___specific___0.bias"], torch.tensor(0.025))
    assert_close(ipu_param["beta2___specific___2.bias"], torch.tensor(0.999))


def test_sgd_with_momentum_has_a_velocity_before_its_first_step():
    model = _model()
    snap = snapshot(SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5))
    params = _clone_params(model)
    device = device_optimizer(snap, params)
    ipu_state, _ = export_state(device, snap, _names(model))
    assert set(ipu_state) == {f"Accl1___{n}" for n in _names(model)}
    assert all(not v.any() for v in ipu_state.values())
    # Written back unchanged, the zero velocity leaves the first step as eager torch's.
    import_state(device, snap, _names(model), ipu_state, None)
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    eager = torch.optim.SGD(eager_params, lr=0.1, momentum=0.9, dampening=0.5)
    _step_both(device, params, eager, eager_params)
    assert_close(params, eager_params)
    # A velocity written before the first step is the one the first step uses.
    fresh = device_optimizer(snap, _clone_params(model))
    velocity = {k: torch.ones_like(v) for k, v in ipu_state.items()}
    import_state(fresh, snap, _names(model), velocity, None)
    assert_close(export_state(fresh, snap, _names(model))[0], velocity)


RESUME_CASES = [
    ("sgd-momentum", lambda p: SGD(p, lr=0.1, momentum=0.9)),
    ("adam", lambda p: Adam(p, lr=0.01)),
    ("adamw-no-bias", lambda p: AdamW(p, lr=0.01, bias_correction=False)),
    ("rmsprop", lambda p: RMSprop(p, lr=0.01, momentum=0.5, centered=True)),
    ("rmsprop-tf", lambda p: RMSprop(p, lr=0.01, momentum=0.5, use_tf_variant=True)),
    ("lamb", lambda p: LAMB(p, lr=0.01)),
]


@pytest.mark.parametrize("name, make", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_state_import_resumes_training_exactly(name, make):
    model = _model()
    snap = snapshot(make(model.parameters()))
    first_params = _clone_params(model)
    first = device_optimizer(snap, first_params)
    for _ in range(2):
        _set_grads(first_params, [torch.randn_like(p) for p in first_params])
        first.step()
    ipu_state, ipu_param = export_state(first, snap, _names(model))
    assert ipu_state and all(not v.requires_grad for v in ipu_state.values())

    second_params = [torch.nn.Parameter(p.detach().clone()) for p in first_params]
    second = device_optimizer(snap, second_params)
    import_state(second, snap, _names(model), ipu_state, ipu_param)
    for _ in range(2):
        grads = [torch.randn_like(p) for p in first_params]
        _set_grads(first_params, grads)
        _set_grads(second_params, grads)
        first.step()
        second.step()
    assert_close(second_params, first_params, rtol=0, atol=0)


def test_import_partial_state_and_hyperparameters(caplog):
    model = _model()
    snap = snapshot(Adam(model.parameters(), lr=0.01))
    device = device_optimizer(snap, _clone_params(model))
    new_state = {"Accl1___0.weight": torch.full((3, 4), 2.0)}
    new_param = {
        "learningRate___specific___0.weight": torch.tensor(0.5),
        "beta1___specific___0.bias": torch.tensor(0.7),
        "unknown___specific___0.bias": torch.tensor(1.0),
    }
    import_state(device, snap, _names(model), new_state, new_param)
    assert "unknown___specific___0.bias" in caplog.text
    state, param = export_state(device, snap, _names(model))
    assert_close(state["Accl1___0.weight"], torch.full((3, 4), 2.0))
    assert_close(state["Accl2___0.weight"], torch.zeros(3, 4))
    # A "specific" value belongs to its one parameter, as in PopART.
    assert_close(param["learningRate___specific___0.weight"], torch.tensor(0.5))
    assert_close(param["learningRate___specific___0.bias"], torch.tensor(0.01))
    assert_close(param["beta1___specific___0.bias"], torch.tensor(0.7))
    assert_close(param["beta1___specific___0.weight"], torch.tensor(0.9))
    assert_close(param["beta2___specific___0.bias"], torch.tensor(0.999))
    import_state(device, snap, _names(model), None, None)  # nothing to write


def test_state_written_before_the_first_step_is_the_one_it_uses():
    # Only some parameters' state is written (as after ``write_ipu_state`` of a partial
    # dict), and the step count arrives as a number: the first device step must run and
    # continue from the written moments and step count, as eager Adam does.
    model = _model()
    snap = snapshot(Adam(model.parameters(), lr=0.01))
    params = _clone_params(model)
    device = FusedOptimizer("adam", device_groups(snap, params)[0])  # the runtime's optimizer
    names = _names(model)
    written = {
        "Accl1___0.bias": torch.full((3,), 0.5),
        "Accl2___0.bias": torch.full((3,), 0.25),
        "Step___0.bias": torch.tensor(3.0),
    }
    import_state(device, snap, names, written, {"learningRate___specific___2.bias": 0.02})
    assert len(device.param_groups) == 2  # 2.bias got its own group
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    eager = torch.optim.Adam(eager_params[:3], lr=0.01)
    eager.add_param_group({"params": eager_params[3:], "lr": 0.02})
    eager.state[eager_params[1]] = {
        "step": torch.tensor(3.0),
        "exp_avg": torch.full((3,), 0.5),
        "exp_avg_sq": torch.full((3,), 0.25),
    }
    _step_both(device, params, eager, eager_params)
    assert_close(params, eager_params)
    assert_close(export_state(device, snap, names)[0]["Step___0.bias"], torch.tensor(5.0))


SPECIFIC_CASES = [
    # (id, optimizer, PopART name, value written, the eager group's values for that parameter)
    ("adam-lr", lambda p: Adam(p, lr=0.01), "learningRate", 0.5, {"lr": 0.5}),
    ("sgd-scaled-lr", lambda p: SGD(p, lr=0.1, momentum=0.9, dampening=0.5, loss_scaling=4.0),
     "scaledLearningRate0", 0.05, {"lr": 0.05 * 4.0 / 0.5}),
    ("sgd-decay-factor", lambda p: SGD(p, lr=0.1, weight_decay=0.01),
     "weightDecayScaleFactor0", 0.9, {"weight_decay": 1.0}),
    ("rmsprop-tf-momentum", lambda p: RMSprop(p, lr=0.01, momentum=0.5, use_tf_variant=True),
     "momentum", 0.25, {"momentum": 0.25}),
    ("lamb-beta1", lambda p: LAMB(p, lr=0.01), "beta1", 0.5, {"betas": (0.5, 0.999)}),
]  # fmt: skip


@pytest.mark.parametrize("name, make, popart, value, own", SPECIFIC_CASES,
                         ids=[c[0] for c in SPECIFIC_CASES])  # fmt: skip
def test_specific_hyperparameter_changes_only_its_parameter(name, make, popart, value, own):
    model = _model()
    names = _names(model)
    snap = snapshot(make(model.parameters()))
    params = _clone_params(model)
    device = device_optimizer(snap, params)
    key = f"{popart}___specific___2.weight"
    _, before = export_state(device, snap, names)
    import_state(device, snap, names, None, {key: torch.tensor(value)})
    _, read = export_state(device, snap, names)
    assert_close(read[key], torch.tensor(value))
    assert_close({k: v for k, v in read.items() if k != key},
                 {k: v for k, v in before.items() if k != key})  # fmt: skip
    # Eager: the same optimizer with 2.weight in a group of its own.
    eager_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    alone = eager_params[names.index("2.weight")]
    others = [p for p in eager_params if p is not alone]
    eager = make([{"params": others}, {"params": [alone], **own}])
    eager = device_optimizer(snapshot(eager), [*others, alone])
    _step_both(device, params, eager, eager_params)
    assert_close(params, eager_params)
    # setOptimizer writes the group's value to every parameter again.
    restore_groups_(device, snap)
    apply_hyperparameters(device, snap)
    assert len(device.param_groups) == len(snap.groups)
    _, read = export_state(device, snap, names)
    assert_close(read[f"{popart}___specific___2.weight"], read[f"{popart}___specific___0.weight"])


def test_specific_values_keep_the_order_of_the_parameters():
    model = _model()
    names = _names(model)
    snap = snapshot(Adam(model.parameters(), lr=0.01))
    device = device_optimizer(snap, _clone_params(model))
    lrs = {"0.bias": 0.1, "2.weight": 0.2}
    import_state(device, snap, names, None,
                 {f"learningRate___specific___{n}": torch.tensor(v) for n, v in lrs.items()})  # fmt: skip
    assert [len(g["params"]) for g in device.param_groups] == [1, 1, 1, 1]
    _, read = export_state(device, snap, names)
    for n in names:
        assert_close(read[f"learningRate___specific___{n}"], torch.tensor(lrs.get(n, 0.01)))
    # The same value for every parameter of a group changes the group, without a split.
    import_state(device, snap, names, None,
                 {f"learningRate___specific___{n}": torch.tensor(0.3) for n in names})  # fmt: skip
    assert len(device.param_groups) == 4
    restore_groups_(device, snap)
    assert [len(g["params"]) for g in device.param_groups] == [4]
    assert device.param_groups[0]["lr"] == pytest.approx(0.3)


def test_imported_loss_scaling_is_returned_and_rescales_sgd():
    model = _model()
    names = _names(model)
    snap = snapshot(SGD(model.parameters(), lr=0.1, loss_scaling=2.0))
    device = device_optimizer(snap, _clone_params(model))
    assert import_state(device, snap, names, None, None) == 2.0
    assert import_state(device, snap, names, None, {"lossScaling_FLOAT": torch.tensor(8.0)}) == 8.0
    assert device.param_groups[0]["lr"] == 0.1  # written alone: the learning rate stays
    # PopART's SGD divides by the loss scaling in scaledLearningRate0: written together with the
    # old one, the update per unscaled gradient grows (lr 0.1 -> 0.4).
    _, read = export_state(device, snap, names)
    read["lossScaling_FLOAT"] = torch.tensor(8.0)
    import_state(device, snap, names, None, read)
    assert device.param_groups[0]["lr"] == pytest.approx(0.4)


@pytest.mark.parametrize("make, ga, has_velocity", [
    (lambda p: SGD(p, lr=0.1), 1, False),
    (lambda p: SGD(p, lr=0.1), 2, True),
    (lambda p: SGD(p, lr=0.1, momentum=0.0), 1, True),
    (lambda p: torch.optim.SGD(p, lr=0.1), 1, False),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5), 1, True),
], ids=["constant-0", "constant-0-ga", "explicit-0", "torch-0", "torch-0.5"])  # fmt: skip
def test_sgd_velocity_unless_momentum_is_a_constant_zero_without_ga(make, ga, has_velocity):
    model = _model()
    snap = snapshot(make(model.parameters()))
    device = device_optimizer(snap, _clone_params(model))
    state, _ = export_state(device, snap, _names(model), gradient_accumulation=ga)
    assert set(state) == ({f"Accl1___{n}" for n in _names(model)} if has_velocity else set())
    assert all(not v.any() for v in state.values())


def test_sgd_marked_variable_momentum_keeps_a_velocity():
    model = _model()
    opt = SGD(model.parameters(), lr=0.1)
    opt.variable_attrs.markAsVariable("momentum")
    snap = snapshot(opt)
    params = _clone_params(model)
    device = device_optimizer(snap, params)
    state, _ = export_state(device, snap, _names(model))
    assert set(state) == {f"Accl1___{n}" for n in _names(model)}
    grads = [torch.randn_like(p) for p in params]
    _set_grads(params, grads)
    device.step()
    state, _ = export_state(device, snap, _names(model))
    assert set(state) == {f"Accl1___{n}" for n in _names(model)}  # still zeros: torch keeps none


# --------------------------------------------------------------------------- host step


def _host_steps(make_opt, steps: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    model = _model()
    opt = make_opt(model.parameters())
    x = torch.randn(5, 4)
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    return model


def test_adamw_host_step_without_bias_correction_matches_device_variant() -> None:
    kwargs = {"lr": 0.05, "weight_decay": 0.1}
    ours = _host_steps(lambda p: AdamW(p, bias_correction=False, **kwargs))
    device = _host_steps(lambda p: AdamWNoBias(p, **kwargs))
    corrected = _host_steps(lambda p: torch.optim.AdamW(p, **kwargs))
    for a, b, c in zip(ours.parameters(), device.parameters(), corrected.parameters()):
        assert_close(a, b)
        assert not torch.allclose(a, c)


def test_adamw_host_step_with_bias_correction_is_torch() -> None:
    ours = _host_steps(lambda p: AdamW(p, lr=0.05))
    reference = _host_steps(lambda p: torch.optim.AdamW(p, lr=0.05))
    for a, b in zip(ours.parameters(), reference.parameters()):
        assert_close(a, b)


# --------------------------------------------------------------------------- mean reduction


def _frozen_options():
    from poptorch_sim.options import Options

    opts = Options()
    opts._freeze()
    return opts


@pytest.mark.parametrize(
    ("make_opt", "expected"),
    [
        (lambda p: Adam(p, accum_type=torch.float16), "Running"),
        (lambda p: SGD(p, lr=0.1, accum_type=torch.float16, use_combined_accum=False), "Running"),
        (lambda p: SGD(p, lr=0.1, accum_type=torch.float16, use_combined_accum=True), "Post"),
        (lambda p: Adam(p), "Post"),
        (lambda p: torch.optim.Adam(p), "Post"),
    ],
    ids=["adam-fp16", "sgd2-fp16", "sgd1-fp16", "adam-fp32", "torch-adam"],
)
def test_mean_reduction_strategy_follows_accum_type(make_opt, expected) -> None:
    from poptorch_sim.enums import MeanReductionStrategy
    from poptorch_sim.optim.device.reduction import apply_mean_reduction_strategy

    opts = _frozen_options()
    apply_mean_reduction_strategy(make_opt(_model().parameters()), opts, compiled=False)
    strategy = opts.Training.meanAccumulationAndReplicationReductionStrategy
    assert strategy == MeanReductionStrategy[expected]
    assert opts._is_frozen


def test_mean_reduction_strategy_cannot_change_after_compilation() -> None:
    from poptorch_sim.optim.device.reduction import apply_mean_reduction_strategy

    opts = _frozen_options()
    opt = Adam(_model().parameters(), accum_type=torch.float16)
    with pytest.raises(ValueError, match="the executable is already compiled"):
        apply_mean_reduction_strategy(opt, opts, compiled=True)
    apply_mean_reduction_strategy(opt, opts, compiled=False)
    apply_mean_reduction_strategy(opt, opts, compiled=True)  # already Running: fine
