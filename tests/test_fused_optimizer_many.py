"""Fused optimizer over many parameters: one tile loop for all, step counters, exact unscaling."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from poptorch_sim.kernels import optim as K
from poptorch_sim.kernels import reference as R
from poptorch_sim.optim.device import FusedOptimizer

# Two multi-tile params around a crowd of small ones: tails, single elements, whole tiles.
MANY_SHAPES = [(40_000,), (3, 1000)] + [((i * 37) % 2100 + 1,) for i in range(150)] + [(1024,)]

CASES = {
    "adamw": ("adamw", torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adam-wd": ("adam", torch.optim.Adam, dict(lr=0.01, weight_decay=0.1)),
    "sgd-momentum": ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "rmsprop-centered": ("rmsprop", torch.optim.RMSprop, dict(lr=0.01, centered=True)),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _params() -> list[torch.Tensor]:
    return [torch.randn(s) for s in MANY_SHAPES]


def _set_grads(groups: list[list[torch.Tensor]], scale: float = 1.0) -> None:
    for ps in zip(*groups):
        g = torch.randn_like(ps[0]) * scale
        for p in ps:
            p.grad = g.clone()


@pytest.mark.parametrize("scaling", [(1.0, math.inf), (3.0, 0.5)], ids=["plain", "ls3-clip"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_many_params_equal_torch_optim(case, scaling):
    kind, tcls, hyper = case
    ls, clip = scaling
    params = _params()
    ref = [p.clone().requires_grad_() for p in params]
    mine = [p.clone().requires_grad_() for p in params]
    topt = tcls(ref, **hyper)
    fopt = FusedOptimizer(kind, [dict(params=mine, **hyper)], loss_scaling=ls,
                          max_grad_norm=clip)  # fmt: skip
    for _ in range(3):
        _set_grads([ref, mine], scale=ls)
        R.unscale_and_clip_ref([p.grad for p in ref], ls, clip)
        topt.step()
        fopt.step()
    for r, m in zip(ref, mine):
        assert_close(m, r)
    for r, m in zip(ref, mine):
        for name, value in topt.state[r].items():
            assert_close(fopt.state[m][name], value, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("kind", ["adamw", "sgd", "rmsprop"])
def test_many_params_off_chip_is_bit_identical(kind, dtype):
    hyper = dict(lr=0.01, momentum=0.9) if kind != "adamw" else dict(lr=0.01)
    params = _params()
    on, off = [p.clone() for p in params], [p.clone() for p in params]
    kw = dict(loss_scaling=2.0, first_order_momentum_accum_type=dtype,
              second_order_momentum_accum_type=dtype)  # fmt: skip
    opt_on = FusedOptimizer(kind, [dict(params=on, **hyper)], **kw)
    opt_off = FusedOptimizer(kind, [dict(params=off, **hyper)], off_chip=True,
                             chunk_elements=2048, **kw)  # fmt: skip
    for _ in range(3):
        _set_grads([on, off])
        opt_on.step()
        opt_off.step()
    for a, b in zip(on, off):
        assert torch.equal(a, b)
        for name, value in opt_on.state[a].items():
            assert torch.equal(value, opt_off.state[b][name]), name


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_does_not_change_results(threads):
    params = _params()
    runs = []
    before = torch.get_num_threads()
    for n in (threads, before):
        torch.manual_seed(1)
        ps = [p.clone() for p in params]
        torch.set_num_threads(n)
        try:
            opt = FusedOptimizer("adamw", [dict(params=ps, lr=0.01)])
            for _ in range(2):
                _set_grads([ps])
                opt.step()
        finally:
            torch.set_num_threads(before)
        runs.append(ps)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["adamw", "sgd", "rmsprop", "lamb"])
def test_power_of_two_loss_scaling_equals_pre_divided_grads(kind):
    # g * (1/8) and g / 8 are the same float: scaling by 8 must give exactly the update of
    # the pre-divided gradient with no scaling.
    params = _params()
    scaled, plain = [p.clone() for p in params], [p.clone() for p in params]
    hyper = dict(lr=0.01, momentum=0.9) if kind in ("sgd", "rmsprop") else dict(lr=0.01)
    opt_s = FusedOptimizer(kind, [dict(params=scaled, **hyper)], loss_scaling=8.0)
    opt_p = FusedOptimizer(kind, [dict(params=plain, **hyper)])
    for _ in range(2):
        for a, b in zip(scaled, plain):
            g = torch.randn_like(a) * 8.0
            a.grad, b.grad = g, g / 8.0
        opt_s.step()
        opt_p.step()
    for a, b in zip(scaled, plain):
        assert torch.equal(a, b)


def test_increment_steps_adds_one_in_place_and_returns_values():
    steps = [torch.tensor(0.0), torch.tensor(4.0), torch.tensor(2, dtype=torch.int64)]
    assert K.increment_steps_(steps) == [1.0, 5.0, 3.0]
    assert [s.item() for s in steps] == [1.0, 5.0, 3]
    assert steps[2].dtype == torch.int64
    assert K.increment_steps_([]) == []


def test_increment_steps_rejects_non_scalars_with_shape():
    with pytest.raises(
        RuntimeError, match=r"steps\[1\] must be a one-element CPU tensor, got \[2\]"
    ):
        K.increment_steps_([torch.tensor(0.0), torch.zeros(2)])


def test_steps_advance_per_param_like_torch():
    # A param without a gradient skips a step: its counter, and so its bias correction, lags.
    a, b = torch.randn(3000), torch.randn(50)
    ra, rb = a.clone().requires_grad_(), b.clone().requires_grad_()
    mine = FusedOptimizer("adam", [a, b], **{})
    ref = torch.optim.Adam([ra, rb], lr=1e-3)
    for step in range(3):
        ga, gb = torch.randn(3000), torch.randn(50)
        a.grad, ra.grad = ga, ga.clone()
        b.grad = gb if step != 1 else None
        rb.grad = gb.clone() if step != 1 else None
        mine.step()
        ref.step()
    assert_close(a, ra.detach())
    assert_close(b, rb.detach())
    assert mine.state[a]["step"].item() == 3.0 and mine.state[b]["step"].item() == 2.0


def _adam_operands() -> tuple:
    params = _params()
    return (params, [torch.randn_like(p) for p in params], [torch.randn_like(p) for p in params],
            [torch.rand_like(p) for p in params], [3.0] * len(params))  # fmt: skip


def test_direct_binding_equals_dispatcher_op():
    hyper = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1,
                 decoupled_weight_decay=True, loss_scaling=3.0)  # fmt: skip
    via_op = _adam_operands()
    direct = tuple([t.clone() for t in x] if x and isinstance(x[0], torch.Tensor) else x
                   for x in via_op)  # fmt: skip
    K.adam_step_(*via_op, **hyper)
    K.adam_step_(*direct, **hyper, direct=True)
    for a, b in zip(via_op[0] + via_op[2] + via_op[3], direct[0] + direct[2] + direct[3]):
        assert torch.equal(a, b)


def test_direct_binding_raises_with_values():
    p, g = [torch.zeros(4)], [torch.zeros(5)]
    with pytest.raises(
        RuntimeError, match=r"grads\[0\] has shape \[5\] but params\[0\] has shape"
    ):
        K.adam_step_(p, g, [torch.zeros(4)], [torch.zeros(4)], [1.0], lr=0.1, beta1=0.9,
                     beta2=0.99, eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False,
                     direct=True)  # fmt: skip


def _fresh_state(p: torch.Tensor) -> dict:
    return {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p)}  # fmt: skip


@pytest.mark.parametrize("how", ["replace-entry", "replace-moment", "reassign-state"])
def test_state_changed_between_steps_is_used(how):
    # The step keeps each group's state dicts between steps; a reset of the state from
    # outside must still make the next step a first step.
    params = _params()
    mine, fresh = [p.clone() for p in params], [p.clone() for p in params]
    opt = FusedOptimizer("adamw", [dict(params=mine, lr=0.01)])
    _set_grads([mine])
    opt.step()
    for p in mine:
        if how == "replace-entry":
            opt.state[p] = _fresh_state(p)
        elif how == "replace-moment":
            opt.state[p].update(_fresh_state(p))
    if how == "reassign-state":
        opt.state = {p: _fresh_state(p) for p in mine}
    for a, b in zip(mine, fresh):
        b.copy_(a)
    ref = FusedOptimizer("adamw", [dict(params=fresh, lr=0.01)])
    _set_grads([mine, fresh])
    opt.step()
    ref.step()
    for a, b in zip(mine, fresh):
        assert torch.equal(a, b)
        assert opt.state[a]["step"].item() == 1.0


def test_param_state_dict_counts_every_change():
    from poptorch_sim.optim.device.param_state import ParamStateDict

    s = ParamStateDict()
    a, b = torch.zeros(1), torch.zeros(1)
    changes = [lambda: s.__setitem__(a, {}), lambda: s.setdefault(b, {}), lambda: s.pop(b),
               lambda: s.update({b: {}}), lambda: s.__delitem__(b), lambda: s.popitem(),
               lambda: s.__ior__({a: {}}), lambda: s.clear()]  # fmt: skip
    for change in changes:
        before = s.version
        change()
        assert s.version > before
    before = s.version
    s.get(a)
    assert s.version == before
