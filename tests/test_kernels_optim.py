"""Accumulation, fused-optimizer, off-chip streaming and device-iteration stream kernels."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from poptorch_sim.executor import streams as S
from poptorch_sim.kernels import optim as K
from poptorch_sim.kernels import reference as R
from poptorch_sim.optim.device import FusedOptimizer

SHAPES = [(2500,), (7, 5), (3,)]  # crosses tile boundaries; a tail tile; a tiny param


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _params(shapes=SHAPES, dtype=torch.float32) -> list[torch.Tensor]:
    return [torch.randn(s, dtype=dtype) for s in shapes]


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.randn_like(p) for p in params]


TORCH_CASES = {
    "sgd": ("sgd", torch.optim.SGD, dict(lr=0.1)),
    "sgd-momentum": ("sgd", torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "sgd-dampening-wd": ("sgd", torch.optim.SGD,
                         dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    "sgd-nesterov-maximize": ("sgd", torch.optim.SGD,
                              dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True)),
    "adam": ("adam", torch.optim.Adam, dict(lr=0.01)),
    "adam-wd-maximize": ("adam", torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, maximize=True,
                                                        betas=(0.8, 0.99), eps=1e-6)),
    "adamw": ("adamw", torch.optim.AdamW, dict(lr=0.01)),
    "adamw-wd": ("adamw", torch.optim.AdamW, dict(lr=0.01, weight_decay=0.3)),
    "rmsprop": ("rmsprop", torch.optim.RMSprop, dict(lr=0.01)),
    # eps=1e-6: with 1e-8, an element whose decayed gradient nearly cancels turns torch's
    # 1-ulp-off (MKL) square root into a visible difference after a few steps.
    "rmsprop-momentum-wd": ("rmsprop", torch.optim.RMSprop,
                            dict(lr=0.01, momentum=0.9, weight_decay=0.1, eps=1e-6)),
    "rmsprop-centered": ("rmsprop", torch.optim.RMSprop, dict(lr=0.01, centered=True)),
    "rmsprop-centered-momentum-maximize": ("rmsprop", torch.optim.RMSprop,
                                           dict(lr=0.01, centered=True, momentum=0.5,
                                                maximize=True, alpha=0.9)),
}  # fmt: skip
SCALING = {"plain": (1.0, math.inf), "ls8": (8.0, math.inf), "ls4-clip": (4.0, 0.5)}


def _run_pair(kind, tcls, hyper, ls, clip, steps=4, **fused_kw):
    params = _params()
    ref = [p.clone().requires_grad_() for p in params]
    mine = [p.clone().requires_grad_() for p in params]
    topt = tcls(ref, **hyper)
    fopt = FusedOptimizer(kind, [dict(params=mine, **hyper)], loss_scaling=ls,
                          max_grad_norm=clip, **fused_kw)  # fmt: skip
    for _ in range(steps):
        grads = _grads(params)
        for p, g in zip(ref, grads):
            p.grad = g.clone()
        R.unscale_and_clip_ref([p.grad for p in ref], ls, clip)
        for p, g in zip(mine, grads):
            p.grad = g.clone()
        topt.step()
        fopt.step()
    return ref, mine, topt, fopt


@pytest.mark.parametrize("scaling", SCALING.values(), ids=SCALING.keys())
@pytest.mark.parametrize("case", TORCH_CASES.values(), ids=TORCH_CASES.keys())
def test_weights_and_state_equal_torch_optim(case, scaling):
    ref, mine, topt, fopt = _run_pair(*case, *scaling)
    for r, m in zip(ref, mine):
        assert_close(m, r)
    tstate, fstate = topt.state_dict()["state"], fopt.state_dict()["state"]
    assert tstate.keys() == fstate.keys()
    for i in tstate:
        assert tstate[i].keys() == fstate[i].keys()
        for name in tstate[i]:
            assert_close(fstate[i][name], tstate[i][name])


@pytest.mark.parametrize("bias_correction", [True, False], ids=["bias-corr", "no-bias-corr"])
@pytest.mark.parametrize("max_weight_norm", [65500.0, 0.5], ids=["wn-default", "wn-clamped"])
def test_lamb_equals_reference(bias_correction, max_weight_norm):
    params = _params() + [torch.zeros(4)]  # a zero weight: trust ratio 1
    mine = [p.clone() for p in params]
    hyper = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.05,
                 max_weight_norm=max_weight_norm, bias_correction=bias_correction)  # fmt: skip
    fopt = FusedOptimizer("lamb", [dict(params=mine, **hyper)], loss_scaling=2.0)
    ref_state: dict = {}
    for _ in range(4):
        grads = _grads(params)
        R.lamb_step_ref(params, [g / 2.0 for g in grads], ref_state, **hyper)
        for p, g in zip(mine, grads):
            p.grad = g
        fopt.step()
    for r, m in zip(params, mine):
        assert_close(m, r)
    for i, st in ref_state.items():
        assert_close(fopt.state[mine[i]]["exp_avg_sq"], st["exp_avg_sq"])


@pytest.mark.parametrize("decoupled", [True, False], ids=["adamw", "adam"])
def test_adam_without_bias_correction_equals_reference(decoupled):
    params = _params()
    mine = [p.clone() for p in params]
    kind = "adamw" if decoupled else "adam"
    hyper = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    fopt = FusedOptimizer(kind, [dict(params=mine, bias_correction=False, **hyper)])
    ref_state: dict = {}
    for _ in range(3):
        grads = _grads(params)
        R.adam_no_bias_correction_ref(params, grads, ref_state, decoupled=decoupled, **hyper)
        for p, g in zip(mine, grads):
            p.grad = g
        fopt.step()
    for r, m in zip(params, mine):
        assert_close(m, r)


@pytest.mark.parametrize("centered", [False, True], ids=["plain", "centered"])
def test_rmsprop_tf_variant_equals_reference(centered):
    params = _params()
    mine = [p.clone() for p in params]
    hyper = dict(lr=0.01, alpha=0.9, eps=1e-3, weight_decay=0.01, momentum=0.5,
                 centered=centered)  # fmt: skip
    fopt = FusedOptimizer("rmsprop", [dict(params=mine, use_tf_variant=True, **hyper)])
    ref_state: dict = {}
    for _ in range(3):
        grads = _grads(params)
        R.rmsprop_tf_ref(params, grads, ref_state, **hyper)
        for p, g in zip(mine, grads):
            p.grad = g
        fopt.step()
    for r, m in zip(params, mine):
        assert_close(m, r)


OFFLOAD_CASES = {
    "sgd": ("sgd", dict(lr=0.1, momentum=0.9)),
    "adamw": ("adamw", dict(lr=0.01, weight_decay=0.1)),
    "rmsprop": ("rmsprop", dict(lr=0.01, momentum=0.9, centered=True)),
    "lamb": ("lamb", dict(lr=0.01)),
    "lamb-fp16-state": ("lamb", dict(lr=0.01)),
}


@pytest.mark.parametrize("case", OFFLOAD_CASES.values(), ids=OFFLOAD_CASES.keys())
def test_off_chip_state_is_bit_identical_and_streamed(case):
    kind, hyper = case
    dtype = torch.float16 if case is OFFLOAD_CASES["lamb-fp16-state"] else torch.float32
    params = _params([(5000,), (1024,), (7, 5)])
    on = [p.clone() for p in params]
    off = [p.clone() for p in params]
    kw = dict(loss_scaling=2.0, max_grad_norm=1.0, first_order_momentum_accum_type=dtype,
              second_order_momentum_accum_type=dtype)  # fmt: skip
    opt_on = FusedOptimizer(kind, [dict(params=on, **hyper)], **kw)
    opt_off = FusedOptimizer(kind, [dict(params=off, **hyper)], off_chip=True,
                             chunk_elements=2048, **kw)  # fmt: skip
    K.offload_reset_stats()
    for _ in range(3):
        for a, b, g in zip(on, off, _grads(params)):
            a.grad, b.grad = g, g.clone()
        opt_on.step()
        opt_off.step()
    for a, b in zip(on, off):
        assert torch.equal(a, b)
    for a, b in zip(on, off):
        for name, value in opt_on.state[a].items():
            assert torch.equal(value, opt_off.state[b][name]), name
    stats = K.offload_stats()
    chunks_per_step = 3 + 1 + 1  # 5000 elements in chunks of 2048, then one chunk each
    passes = 2 if kind == "lamb" else 1  # LAMB reads the moments again for the update
    assert stats["chunks"] == 3 * chunks_per_step * passes
    state_elems = sum(p.numel() for p in params) * len(opt_off.state[off[0]].keys() - {"step"})
    size = torch.finfo(dtype).bits // 8
    assert stats["bytes_to_device"] == 3 * passes * state_elems * size
    assert stats["bytes_to_host"] == 3 * state_elems * size


@pytest.mark.parametrize("case", [c for c in TORCH_CASES.items() if c[0] in
                                  ("sgd-momentum", "adamw-wd", "rmsprop-centered")],
                         ids=lambda c: c[0])  # fmt: skip
def test_state_dict_round_trips_with_torch(case):
    kind, tcls, hyper = case[1]
    ref, mine, topt, fopt = _run_pair(kind, tcls, hyper, 1.0, math.inf, steps=2)
    # fused -> torch, and torch -> fused; then both continue identically.
    fresh_t = [p.detach().clone().requires_grad_() for p in mine]
    topt2 = tcls(fresh_t, **hyper)
    topt2.load_state_dict(fopt.state_dict())
    fresh_f = [p.detach().clone().requires_grad_() for p in ref]
    fopt2 = FusedOptimizer(kind, [dict(params=fresh_f, **hyper)])
    fopt2.load_state_dict(topt.state_dict())
    for _ in range(2):
        for a, b, g in zip(fresh_t, fresh_f, _grads(ref)):
            a.grad, b.grad = g, g.clone()
        topt2.step()
        fopt2.step()
    for a, b in zip(fresh_t, fresh_f):
        assert_close(b, a)


def test_set_hyperparameters_changes_lr_like_torch():
    ref, mine, topt, fopt = _run_pair("adam", torch.optim.Adam, dict(lr=0.01), 1.0, math.inf, 1)
    topt.param_groups[0]["lr"] = 0.5
    fopt.set_hyperparameters(topt.param_groups)
    for a, b, g in zip(ref, mine, _grads(ref)):
        a.grad, b.grad = g, g.clone()
    topt.step()
    fopt.step()
    for a, b in zip(ref, mine):
        assert_close(b, a)
    assert fopt.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("kind", ["adam", "sgd", "rmsprop"])
def test_fp16_state_and_grads(kind):
    params = _params()
    mine = [p.clone() for p in params]
    exact = [p.clone() for p in params]
    hyper = dict(lr=0.01, momentum=0.9) if kind == "sgd" else dict(lr=0.01)
    half = FusedOptimizer(kind, [dict(params=mine, **hyper)], accum_type=torch.float16,
                          first_order_momentum_accum_type=torch.float16,
                          second_order_momentum_accum_type=torch.float16)  # fmt: skip
    full = FusedOptimizer(kind, [dict(params=exact, **hyper)])
    for _ in range(3):
        grads = [g.half() for g in _grads(params)]
        half.step(grads)  # float16 accumulators of float32 params, passed explicitly
        full.step([g.float() for g in grads])
    for a, b in zip(mine, exact):
        assert_close(a, b, atol=2e-3, rtol=2e-3)
        for value in half.state[a].values():
            assert value.dtype == (torch.float32 if value.dim() == 0 else torch.float16)


def test_fp16_params_are_updated_in_fp16():
    p16 = torch.randn(3000).half()
    p32 = p16.float()
    mine, ref = p16.clone(), p32.clone().requires_grad_()
    g = torch.randn(3000)
    mine.grad, ref.grad = g.half(), g.half().float()
    FusedOptimizer("sgd", [mine], **{}).step()
    torch.optim.SGD([ref], lr=1e-3).step()
    assert mine.dtype == torch.float16
    assert_close(mine, ref.detach().half())


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.float16], ids=["g32", "g16"])
@pytest.mark.parametrize("acc_dtype", [torch.float32, torch.float16], ids=["acc32", "acc16"])
def test_accumulate_matches_reference(acc_dtype, grad_dtype):
    acc = torch.randn(3001).to(acc_dtype)
    expected = acc.clone()
    for scale in (0.25, 1.0):
        g = torch.randn(3001).to(grad_dtype)
        assert K.accumulate_(acc, g, scale) is acc
        R.accumulate_ref(expected, g, scale)
    assert torch.equal(acc, expected)


def test_accumulate_many_over_flat_buffers():
    accs = [torch.zeros(5, 3), torch.zeros(2000)]
    grads = [torch.ones(15), torch.full((2000,), 2.0)]
    K.accumulate_many_(accs, grads, 0.5)
    assert_close(accs[0], torch.full((5, 3), 0.5))
    assert_close(accs[1], torch.ones(2000))


def test_grad_norm_equals_clip_grad_norm():
    grads = _grads(_params())
    expected = torch.nn.utils.get_total_norm([g / 4.0 for g in grads])
    assert_close(K.grad_norm(grads, 4.0), expected)


def _adam_kwargs(**over):
    kw = dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0,
              decoupled_weight_decay=False)  # fmt: skip
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        (
            ([torch.zeros(4)], [torch.zeros(5)], [torch.zeros(4)], [torch.zeros(4)], [1.0]),
            {},
            r"grads\[0\] has shape \[5\] but params\[0\] has shape \[4\]",
        ),
        (
            (
                [torch.zeros(4)],
                [torch.zeros(4, dtype=torch.float64)],
                [torch.zeros(4)],
                [torch.zeros(4)],
                [1.0],
            ),
            {},
            r"grads\[0\] must be float32.*got Double",
        ),
        (
            (
                [torch.zeros(4, 2).t()],
                [torch.zeros(2, 4)],
                [torch.zeros(2, 4)],
                [torch.zeros(2, 4)],
                [1.0],
            ),
            {},
            r"params\[0\] must be contiguous",
        ),
        (
            ([torch.zeros(4)], [], [torch.zeros(4)], [torch.zeros(4)], [1.0]),
            {},
            r"same length, got 1 params and 0 grads",
        ),
        (
            ([torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)], [0.0]),
            {},
            r"steps\[0\] must be >= 1",
        ),
        (
            ([torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)], [1.0]),
            {"chunk_elements": 1000},
            r"multiple of 1024, got 1000",
        ),
        (
            ([torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)], [torch.zeros(4)], [1.0]),
            {"loss_scaling": 0.0},
            r"loss_scaling must be a positive finite number, got 0",
        ),
    ],
    ids=["shape", "dtype", "non-contiguous", "lengths", "step", "chunk", "loss-scaling"],
)
def test_bad_optimizer_input_raises_with_values(args, kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        K.adam_step_(*args, **_adam_kwargs(**kwargs))


def test_bad_accumulate_input_raises_with_values():
    with pytest.raises(RuntimeError, match=r"accum has 4 elements \(shape \[4\]\) but grad has 5"):
        K.accumulate_(torch.zeros(4), torch.zeros(5), 1.0)
    with pytest.raises(RuntimeError, match=r"accum must be float32.*got Long"):
        K.accumulate_(torch.zeros(4, dtype=torch.long), torch.zeros(4), 1.0)


def test_fused_optimizer_rejects_bad_configuration():
    w = torch.zeros(3)
    with pytest.raises(ValueError, match=r"unknown optimizer kind 'adagrad' \(known kinds: sgd"):
        FusedOptimizer("adagrad", [w])
    with pytest.raises(ValueError, match="Only non-amsgrad Adam/AdamW optimizers are supported."):
        FusedOptimizer("adam", [dict(params=[w], amsgrad=True)])
    with pytest.raises(ValueError, match=r"unknown sgd hyper-parameter\(s\) \['betas'\]"):
        FusedOptimizer("sgd", [dict(params=[w], betas=(0.9, 0.9))])
    with pytest.raises(AssertionError, match="Accumulation types must be either torch.float32"):
        FusedOptimizer("adam", [w], accum_type=torch.float64)


def _opcheck_cases():
    p, g = torch.randn(1500), torch.randn(1500)
    z = torch.zeros(1500)
    common = dict(loss_scaling=2.0, clip_coef=0.5, chunk_elements=1024)
    yield "accumulate_", (z.clone(), g, 0.5), {}
    yield "accumulate_many_", ([z.clone()], [g], 0.5), {}
    yield "grad_norm", ([g], 2.0), {}
    yield "stream_sum", ([p, g, z, p], 2), {}
    yield "sgd_step_", ([p.clone()], [g], [z.clone()]), dict(
        lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False,
        maximize=False, first_step=True, **common)  # fmt: skip
    yield "adam_step_", ([p.clone()], [g], [z.clone()], [z.clone()], [1.0]), dict(
        lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, decoupled_weight_decay=True,
        bias_correction=True, maximize=False, **common)  # fmt: skip
    yield "rmsprop_step_", ([p.clone()], [g], [z.clone()], [z.clone()], [z.clone()]), dict(
        lr=0.1, alpha=0.9, eps=1e-8, weight_decay=0.0, momentum=0.9, centered=True,
        maximize=False, use_tf_variant=False, **common)  # fmt: skip
    yield "lamb_step_", ([p.clone()], [g], [z.clone()], [z.clone()], [1.0]), dict(
        lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, max_weight_norm=10.0,
        bias_correction=True, **common)  # fmt: skip


@pytest.mark.parametrize("name,args,kwargs", list(_opcheck_cases()),
                         ids=[c[0] for c in _opcheck_cases()])  # fmt: skip
def test_opcheck(name, args, kwargs):
    torch.library.opcheck(getattr(torch.ops.poptorch_sim, name).default, args, kwargs)


# ---------------------------------------------------------------- device-iteration streams


def test_micro_batches_are_views_in_di_ga_r_order():
    di, ga, r, mb = 3, 2, 2, 2
    host = torch.arange(di * ga * r * mb * 3).reshape(-1, 3)
    views = S.micro_batches(host, di, ga, r)
    grid = host.reshape(di, ga, r, mb, 3)
    assert len(views) == di * ga * r
    for d in range(di):
        for a in range(ga):
            for k in range(r):
                v = views[(d * ga + a) * r + k]
                assert torch.equal(v, grid[d, a, k])
                assert v.untyped_storage().data_ptr() == host.untyped_storage().data_ptr()


def test_micro_batches_rejects_indivisible_batch():
    with pytest.raises(AssertionError, match=r"Invalid batch dimension: In the input \(10, 3\)"
                       r", the batch dimension \(10\) must be a multiple of "
                       r"Options.deviceIterations\(2\)"):  # fmt: skip
        S.micro_batches(torch.zeros(10, 3), 2, 3, 1)


MODES = {"all": ("all", 1), "everyn": ("everyn", 3), "final": ("final", 1), "sum": ("sum", 1)}
LAYOUTS = {"di6-ga2-r2": (6, 2, 2), "di3-ga1-r1": (3, 1, 1), "di1-ga1-r1": (1, 1, 1)}


@pytest.mark.parametrize("traced", [(2, 4), ()], ids=["mb-rows", "scalar"])
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_assemble_matches_cat_stack_reference(mode, layout, traced):
    name, period = mode
    di, ga, r = layout
    if name == "everyn" and di % period:
        period = 1
    outs = [torch.randn(traced) for _ in range(di * ga * r)]
    got = S.assemble(outs, name, period, di, ga, r)
    assert_close(got, R.assemble_ref(outs, name, period, di, ga, r))
    b_dim = S.output_batch_dim(name, period, di, ga, r)
    if b_dim == 1:
        expected_shape = traced
    else:
        expected_shape = (b_dim,) if not traced else (traced[0] * b_dim, *traced[1:])
    assert tuple(got.shape) == tuple(expected_shape)


def test_assemble_worked_example_shapes():
    # reference §2.3: mb=2, DI=3, GA=4, R=2, out [mb,10], loss []
    n = 3 * 4 * 2
    outs, losses = [torch.zeros(2, 10)] * n, [torch.zeros(())] * n
    assert S.assemble(outs, "all", 1, 3, 4, 2).shape == (48, 10)
    assert S.assemble(losses, "all", 1, 3, 4, 2).shape == (24,)
    assert S.assemble(outs, "everyn", 3, 3, 4, 2).shape == (16, 10)
    assert S.assemble(losses, "everyn", 3, 3, 4, 2).shape == (8,)
    assert S.assemble(outs, "final", 1, 3, 4, 2).shape == (4, 10)
    assert S.assemble(losses, "sum", 1, 3, 4, 2).shape == (2,)


def test_assemble_rejects_bad_period_and_count():
    outs = [torch.zeros(2)] * 4
    with pytest.raises(ValueError, match="Return period must be a factor"):
        S.assemble(outs, "everyn", 3, 4, 1, 1)
    with pytest.raises(ValueError, match="Return period must be <="):
        S.assemble(outs, "everyn", 5, 4, 1, 1)
    with pytest.raises(ValueError, match=r"DI\*GA\*R = 2\*1\*1 = 2 micro-batch outputs, got 4"):
        S.assemble(outs, "all", 1, 2, 1, 1)


def test_updates_are_published_to_the_tile_engine_counters():
    from poptorch_sim import kernels

    kernels.reset_counters()
    w = torch.randn(5000)
    w.grad = torch.randn(5000)
    FusedOptimizer("adamw", [w], off_chip=True, chunk_elements=2048).step()
    table = kernels.counters()
    assert table["adam_step_"].calls == 1
    assert table["optimizer_offload"].supersteps == 3  # ceil(5000 / 2048) chunks
    assert table["optimizer_offload"].bytes_exchanged == 2 * 2 * 5000 * 4  # 2 states, both ways


def test_params_without_grad_are_left_alone():
    a, b = torch.randn(10), torch.randn(10)
    a.grad = torch.randn(10)
    before = b.clone()
    opt = FusedOptimizer("adam", [a, b])
    opt.step()
    assert torch.equal(b, before)
    assert b not in opt.state and a in opt.state
