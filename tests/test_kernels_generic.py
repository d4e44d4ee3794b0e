"""The generic (any-device) kernels against the C++ CPU kernels, and their CUDA registration.

On the CPU each generic implementation is called directly and compared with the C++ op on the
same inputs: sorting and NMS results are identical, optimizer updates agree over several steps.
The ``cuda`` tests run the registered CUDA kernels; they are skipped without a CUDA device.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable

import pytest
import torch
from oracle import train_reference
from torch.testing import assert_close

import poptorch_sim as poptorch
from poptorch_sim import kernels as K
from poptorch_sim.kernels import generic as G
from poptorch_sim.optim.device import FusedOptimizer

OPS = torch.ops.poptorch_sim
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as integers of its width, so NaN payloads and the sign of zero compare too."""
    if not t.is_floating_point():
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _assert_same(mine: torch.Tensor, theirs: torch.Tensor) -> None:
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
    assert mine.is_contiguous() == theirs.is_contiguous()
    assert torch.equal(_bits(mine.cpu()), _bits(theirs.cpu()))


# ------------------------------------------------------------------------------- sorting

SORT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8]  # fmt: skip


def _sortable(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Values with many ties; floats also with -0.0, 0.0, NaN and infinities."""
    if not dtype.is_floating_point:
        high = 256 if dtype == torch.uint8 else 100
        low = 0 if dtype == torch.uint8 else -100
        return torch.randint(low, high, shape, dtype=dtype)
    x = torch.randint(-20, 20, shape).to(torch.float64) / 4
    flat = x.view(-1)
    specials = torch.tensor([-0.0, 0.0, math.nan, math.inf, -math.inf, -0.0, math.nan])
    where = torch.randperm(flat.numel())[: min(flat.numel(), 7 * 5)]
    flat[where] = specials.repeat(5)[: where.numel()].double()
    return x.to(dtype)


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize("dim", [-1, 0], ids=["dim-1", "dim0"])
@pytest.mark.parametrize("dtype", SORT_DTYPES, ids=str)
def test_sort_and_argsort_equal_the_tile_kernel(dtype, dim, descending):
    x = _sortable((37, 300), dtype)
    for mine, theirs in zip(G.sort(x, dim, descending), OPS.sort(x, dim, descending)):
        _assert_same(mine, theirs)
    _assert_same(G.argsort(x, dim, descending), OPS.argsort(x, dim, descending))


@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize("k", [0, 1, 17, 300], ids=lambda k: f"k{k}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
def test_topk_equals_the_tile_kernel(dtype, k, largest):
    x = _sortable((9, 300), dtype)
    for dim in (-1, 1):
        for mine, theirs in zip(G.topk(x, k, dim, largest), OPS.topk(x, k, dim, largest)):
            _assert_same(mine, theirs)


def test_zero_dim_and_empty_inputs_match():
    scalar = torch.tensor(2.5)
    for mine, theirs in zip(G.sort(scalar), OPS.sort(scalar)):
        _assert_same(mine, theirs)
    for mine, theirs in zip(G.topk(scalar, 1), OPS.topk(scalar, 1)):
        _assert_same(mine, theirs)
    empty = torch.empty(3, 0)
    for mine, theirs in zip(G.sort(empty), OPS.sort(empty)):
        _assert_same(mine, theirs)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m: m.sort(torch.ones(3, dtype=torch.bool)), "unsupported dtype"),
        (lambda m: m.topk(torch.ones(3), 4), "k out of range: k=4"),
        (lambda m: m.topk(torch.ones(3), -1), "k out of range: k=-1"),
    ],
    ids=["bool-dtype", "k-too-large", "k-negative"],
)
def test_sorting_errors_match_the_tile_kernel(call: Callable, match: str):
    for module in (G, OPS):
        with pytest.raises(RuntimeError, match=match):
            call(module)


# ------------------------------------------------------------------------------- NMS


def _boxes(n: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    xy = torch.rand(n, 2) * 100
    wh = torch.rand(n, 2) * 30
    scores = torch.randint(0, 8, (n,)).double() / 8  # many equal scores
    return torch.cat([xy, xy + wh], 1).to(dtype), scores.to(dtype)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.7], ids=lambda t: f"iou{t}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("n", [0, 1, 500], ids=lambda n: f"n{n}")
def test_nms_equals_the_tile_kernel(n, dtype, threshold):
    boxes, scores = _boxes(n, dtype)
    assert torch.equal(G.nms(boxes, scores, threshold), OPS.nms(boxes, scores, threshold))


@pytest.mark.parametrize(
    "n", [0, 300, 1000, 1001, 2000],
    ids=["empty", "offset-path", "offset-path-limit", "per-class-path-limit", "per-class-path"],
)  # fmt: skip
def test_batched_nms_equals_the_tile_kernel(n):
    boxes, scores = _boxes(n)
    idxs = torch.randint(0, 5, (n,))
    mine = G.batched_nms(boxes, scores, idxs, 0.4)
    assert torch.equal(mine, OPS.batched_nms(boxes, scores, idxs, 0.4))
    if n:
        assert mine.numel() > 0


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 1 / 3], ids=lambda t: f"iou{t:.3f}")
def test_nms_threshold_decides_like_the_double_comparison_in_float(threshold):
    # torchvision's CUDA kernel compares the float IoU with a float threshold; the generic
    # kernels hand it one that decides every float IoU as `iou > threshold` in double does.
    from poptorch_sim.kernels.generic.sorting import _threshold

    f = torch.tensor(_threshold(torch.zeros(1, 4), threshold), dtype=torch.float32)
    near = torch.tensor(threshold, dtype=torch.float32)
    ious = [near]
    for direction in (math.inf, -math.inf):
        x = near
        for _ in range(3):
            x = torch.nextafter(x, torch.tensor(direction, dtype=torch.float32))
            ious.append(x)
    for iou in ious:
        assert bool(iou > f) == (float(iou) > threshold), float(iou)


def test_nms_rejects_nan_boxes_like_the_tile_kernel():
    boxes, scores = _boxes(4)
    boxes[2, 1] = math.nan
    for module in (G, OPS):
        with pytest.raises(RuntimeError, match=r"NaN coordinates \(1 of 4 boxes\)"):
            module.nms(boxes, scores, 0.5)


# ------------------------------------------------------------------------------- streams


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32],
                         ids=str)  # fmt: skip
@pytest.mark.parametrize("replicas", [1, 2, 3], ids=lambda r: f"R{r}")
def test_stream_sum_equals_the_tile_kernel(replicas, dtype):
    outs = [(torch.randn(5, 1500) * 100).to(dtype) for _ in range(4 * replicas)]
    _assert_same(G.stream_sum(outs, replicas), OPS.stream_sum(outs, replicas))


@pytest.mark.parametrize(
    "grad_dtype, acc_dtype",
    [(torch.float32, torch.float32), (torch.float32, torch.float16),
     (torch.float16, torch.float16), (torch.bfloat16, torch.float32)],
    ids=["f32-f32", "f32-into-f16", "f16-f16", "bf16-into-f32"],
)  # fmt: skip
def test_accumulate_equals_the_tile_kernel(grad_dtype, acc_dtype):
    accums = [torch.randn(2500).to(acc_dtype) for _ in range(2)]
    grads = [torch.randn(50, 50).to(grad_dtype), torch.randn(2500).to(grad_dtype)]
    mine, theirs = [a.clone() for a in accums], [a.clone() for a in accums]
    for scale in (0.25, 1.0 / 3):
        G.accumulate_(mine[0], grads[0], scale)
        OPS.accumulate_(theirs[0], grads[0], scale)
        G.accumulate_many_(mine, grads, scale)
        OPS.accumulate_many_(theirs, grads, scale)
    for m, t in zip(mine, theirs):
        _assert_same(m, t)


# ------------------------------------------------------------------------------- optimizers

SHAPES = [(2500,), (7, 5), (3,)]  # crosses tile and chunk boundaries; a tiny param

# kind -> (state names with their order (0: first, 1: second moment), op hyper-parameters)
CASES = {
    "sgd": ([], dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                     maximize=False)),
    "sgd-momentum-wd-maximize": ([0], dict(lr=0.1, momentum=0.9, dampening=0.2,
                                           weight_decay=0.01, nesterov=False, maximize=True)),
    "sgd-nesterov": ([0], dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.0,
                               nesterov=True, maximize=False)),
    "adam-wd": ([0, 1], dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1,
                             decoupled_weight_decay=False, bias_correction=True,
                             maximize=False)),
    "adamw-maximize": ([0, 1], dict(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.3,
                                    decoupled_weight_decay=True, bias_correction=True,
                                    maximize=True)),
    "adamw-no-bias-correction": ([0, 1], dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8,
                                              weight_decay=0.1, decoupled_weight_decay=True,
                                              bias_correction=False, maximize=False)),
    "rmsprop": ([1, 0, 0], dict(lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                                centered=False, maximize=False, use_tf_variant=False)),
    "rmsprop-centered-momentum-wd": ([1, 0, 0], dict(lr=0.01, alpha=0.9, eps=1e-6,
                                                     weight_decay=0.1, momentum=0.5,
                                                     centered=True, maximize=True,
                                                     use_tf_variant=False)),
    "rmsprop-tf-centered": ([1, 0, 0], dict(lr=0.01, alpha=0.9, eps=1e-3, weight_decay=0.0,
                                            momentum=0.9, centered=True, maximize=False,
                                            use_tf_variant=True)),
    "lamb": ([0, 1], dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01,
                          max_weight_norm=65500.0, bias_correction=True)),
    "lamb-clamped-no-bias-correction": ([0, 1], dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-6,
                                                     weight_decay=0.05, max_weight_norm=0.5,
                                                     bias_correction=False)),
}  # fmt: skip
SCALING = {"plain": (1.0, 1.0), "ls8": (8.0, 1.0), "ls4-clip": (4.0, 0.37)}


def _step(module, name: str, params, grads, states, step: int, hyper: dict, common: dict):
    """One update through ``module`` (the generic package or ``torch.ops.poptorch_sim``)."""
    kind = name.split("-")[0]
    if kind == "sgd":
        bufs = states[0] if hyper["momentum"] else []
        module.sgd_step_(params, grads, bufs, first_step=step == 1, **hyper, **common)
    elif kind in ("adam", "adamw"):
        module.adam_step_(params, grads, *states, [float(step)] * len(params), **hyper, **common)
    elif kind == "rmsprop":
        mom = states[1] if hyper["momentum"] else []
        avg = states[2] if hyper["centered"] else []
        module.rmsprop_step_(params, grads, states[0], mom, avg, **hyper, **common)
    else:
        module.lamb_step_(params, grads, *states, [float(step)] * len(params), **hyper, **common)


def _run(module, name, orders, hyper, scaling, state_dtype, chunk, param_dtype, steps=4):
    torch.manual_seed(1)
    params = [torch.randn(s).to(param_dtype) for s in SHAPES]
    dtypes = (torch.float32, state_dtype)
    states = [[torch.zeros(s, dtype=dtypes[o]) for s in SHAPES] for o in orders]
    if name.startswith("rmsprop-tf"):
        for t in states[0]:
            t.fill_(1.0)  # RMSpropTF starts its mean square at 1
    ls, clip = scaling
    for step in range(1, steps + 1):
        grads = [(torch.randn(s) * ls).to(param_dtype) for s in SHAPES]
        common = dict(loss_scaling=ls, clip_coef=clip, chunk_elements=chunk)
        _step(module, name, params, grads, states, step, hyper, common)
    return params, [t for lst in states for t in lst]


@pytest.mark.parametrize("scaling", SCALING.values(), ids=SCALING.keys())
@pytest.mark.parametrize("case", CASES.items(), ids=CASES.keys())
def test_optimizer_steps_match_the_tile_kernel(case, scaling):
    name, (orders, hyper) = case
    mine = _run(G, name, orders, hyper, scaling, torch.float32, 0, torch.float32)
    theirs = _run(OPS, name, orders, hyper, scaling, torch.float32, 0, torch.float32)
    for m, t in zip(mine[0] + mine[1], theirs[0] + theirs[1]):
        assert_close(m, t, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", CASES.items(), ids=CASES.keys())
def test_fp16_state_and_params_match_the_tile_kernel(case):
    name, (orders, hyper) = case
    for param_dtype in (torch.float32, torch.float16):
        args = (name, orders, hyper, SCALING["ls4-clip"], torch.float16, 0, param_dtype)
        mine, theirs = _run(G, *args), _run(OPS, *args)
        for m, t in zip(mine[0] + mine[1], theirs[0] + theirs[1]):
            assert m.dtype == t.dtype
            assert_close(m, t, rtol=2e-3, atol=1e-5)


@pytest.mark.parametrize("case", CASES.items(), ids=CASES.keys())
def test_off_chip_streaming_matches_on_chip_and_the_tile_kernel_counters(case):
    name, (orders, hyper) = case
    args = (name, orders, hyper, SCALING["ls8"], torch.float16)
    on_chip = _run(G, *args, 0, torch.float32)
    K.offload_reset_stats()
    streamed = _run(G, *args, 1024, torch.float32)
    generic_counts = G.offload.stats()
    K.offload_reset_stats()
    _run(OPS, *args, 1024, torch.float32)
    assert generic_counts == list(OPS.offload_stats())
    assert (generic_counts[0] > 0) == bool(orders)
    for a, b in zip(on_chip[0] + on_chip[1], streamed[0] + streamed[1]):
        assert torch.equal(a, b)


def test_grad_norm_matches_the_tile_kernel():
    grads = [torch.randn(2500) * 3, torch.randn(7, 5).half(), torch.randn(3)]
    for ls in (1.0, 8.0):
        assert_close(G.grad_norm(grads, ls), OPS.grad_norm(grads, ls), rtol=1e-7, atol=0)


BAD_STEPS = {
    "chunk": (dict(chunk_elements=1000), "positive multiple of 1024, got 1000"),
    "loss-scaling": (dict(loss_scaling=0.0), "positive finite number, got 0"),
    "clip": (dict(clip_coef=-1.0), "clip_coef must be >= 0"),
}


@pytest.mark.parametrize("bad", BAD_STEPS.values(), ids=BAD_STEPS.keys())
def test_optimizer_argument_errors_match_the_tile_kernel(bad):
    override, match = bad
    p, g, m, v = (torch.zeros(4) for _ in range(4))
    kw = dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0,
              decoupled_weight_decay=False, bias_correction=True, maximize=False,
              loss_scaling=1.0, clip_coef=1.0, chunk_elements=0)  # fmt: skip
    kw.update(override)
    for module in (G, OPS):
        with pytest.raises(RuntimeError, match=match):
            module.adam_step_([p], [g], [m], [v], [1.0], **kw)
    for module in (G, OPS):
        with pytest.raises(RuntimeError, match=r"exp_avgs\[0\] has shape \[3\]"):
            module.adam_step_([p], [g], [torch.zeros(3)], [v], [1.0],
                              **{**kw, **dict(chunk_elements=0, loss_scaling=1.0,
                                             clip_coef=1.0)})  # fmt: skip


# ------------------------------------------------------------------------------- dispatch


def _library_ops() -> list[str]:
    return sorted(n for n in torch._C._dispatch_get_all_op_names()
                  if n.startswith("poptorch_sim::"))  # fmt: skip


def test_every_op_has_a_cuda_kernel():
    """A new op with a CPU kernel must come with a generic implementation for CUDA."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    ops = _library_ops()
    assert len(ops) >= len(G.KERNELS)
    missing = [n for n in ops if has(n, "CPU") and not has(n, "CUDA")]
    assert missing == [], f"ops with a CPU kernel but no CUDA kernel: {missing}"
    device_bound = [n for n in ops if not has(n, "CUDA")]
    assert all(has(n, "CompositeImplicitAutograd") for n in device_bound), device_bound
    assert {n.removeprefix("poptorch_sim::") for n in ops if has(n, "CPU")} == set(G.KERNELS)


class _TwoStages(torch.nn.Module):
    def __init__(self, width: int = 2100) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(6, width), torch.nn.Linear(width, 3)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        with poptorch.Block("B1", ipu_id=0):
            h = torch.relu(self.fc1(x))
        with poptorch.Block("B2", ipu_id=1):
            out = self.fc2(h)
            loss = self.loss(out, y)
        return out, loss


def _pipelined_options(ga: int, on_chip_optimizer: bool) -> poptorch.Options:
    """2 device iterations of ``ga`` pipelined micro-batches, outputs summed."""
    opts = (
        poptorch.Options()
        .deviceIterations(2)
        .setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    )
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.Sum)
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(on_chip_optimizer)
    )
    return opts


def _train_two_stages(opt_name: str) -> tuple[list[torch.Tensor], list]:
    torch.manual_seed(0)
    model = _TwoStages()
    opts = _pipelined_options(ga=3, on_chip_optimizer=False)
    make = {
        "AdamW": lambda p: poptorch.optim.AdamW(p, lr=0.01, loss_scaling=16.0, max_grad_norm=0.5),
        "LAMB": lambda p: poptorch.optim.LAMB(p, lr=0.01, loss_scaling=4.0),
        "SGD": lambda p: poptorch.optim.SGD(p, lr=0.05, momentum=0.9),
    }[opt_name]
    training = poptorch.trainingModel(model, opts, make(model.parameters()))
    x, y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    K.offload_reset_stats()
    outs = [training(x, y) for _ in range(3)]
    assert K.offload_stats()["chunks"] > 0
    training.destroy()
    return [t.detach().clone() for t in model.parameters()], outs  # fmt: skip


def test_generic_kernels_through_the_dispatcher_train_like_the_tile_kernels(monkeypatch):
    """A 2-stage pipelined trainingModel (off-chip state, loss scaling, clipping, Sum output)
    with the generic kernels registered for the CPU matches the C++ kernels' run: the schema's
    calling convention, FusedOptimizer and the output stream work through the dispatcher as
    they will with CUDA tensors. The generic kernels replace the CPU ones for this test only:
    removing their registration gives the C++ kernels back (checked at the end)."""
    from poptorch_sim.kernels import optim as kernel_optim

    cpp = {name: _train_two_stages(name) for name in ("AdamW", "LAMB", "SGD")}
    calls: list[str] = []

    def counted(name: str, fn: Callable) -> Callable:
        def kernel(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return kernel

    lib = torch.library.Library("poptorch_sim", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that each CPU kernel is overridden
            for name, fn in G.KERNELS.items():
                lib.impl(name, counted(name, fn), "CPU")  # the dispatcher calls these now
        through_dispatcher = kernel_optim._call  # and FusedOptimizer uses it, not the bindings
        monkeypatch.setattr(kernel_optim, "_call",
                            lambda name, direct, *rest: through_dispatcher(name, False, *rest))  # fmt: skip
        for name, (weights, outs) in cpp.items():
            G.offload.reset_stats()
            mine, my_outs = _train_two_stages(name)
            assert G.offload.stats()[0] > 0, name
            for a, b in zip(mine, weights):
                assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
            for a, b in zip(my_outs, outs):
                assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        assert {"adam_step_", "lamb_step_", "sgd_step_", "stream_sum"} <= set(calls)
    finally:
        lib._destroy()
    calls.clear()
    OPS.sort(torch.randn(3, 40), -1, False)
    OPS.stream_sum([torch.randn(4, 5) for _ in range(2)], 1)
    assert calls == []  # the C++ kernels again


# ------------------------------------------------------------------------------- on CUDA


@pytest.mark.cuda
@needs_cuda
def test_sorting_family_on_cuda_equals_the_tile_kernel():
    for dtype in SORT_DTYPES:
        x = _sortable((37, 3000), dtype)
        for mine, theirs in zip(K.sort(x.cuda(), 1, True), OPS.sort(x, 1, True)):
            _assert_same(mine, theirs)
        for mine, theirs in zip(K.topk(x.cuda(), 25, 0, False), OPS.topk(x, 25, 0, False)):
            _assert_same(mine, theirs)
        _assert_same(K.argsort(x.cuda(), 0), OPS.argsort(x, 0))
    boxes, scores = _boxes(3000)
    idxs = torch.randint(0, 5, (3000,))
    assert torch.equal(K.nms(boxes.cuda(), scores.cuda(), 0.5).cpu(), OPS.nms(boxes, scores, 0.5))
    for n in (300, 3000):
        b, s, i = boxes[:n], scores[:n], idxs[:n]
        mine = K.batched_nms(b.cuda(), s.cuda(), i.cuda(), 0.5)
        assert mine.device.type == "cuda"
        assert torch.equal(mine.cpu(), OPS.batched_nms(b, s, i, 0.5))


@pytest.mark.cuda
@needs_cuda
def test_accumulate_and_stream_sum_on_cuda_equal_the_tile_kernel():
    acc, grad = torch.randn(5000).half(), torch.randn(5000)
    mine = acc.cuda()
    K.accumulate_(mine, grad.cuda(), 0.5)
    OPS.accumulate_(acc, grad, 0.5)
    _assert_same(mine, acc)
    outs = [torch.randn(4, 700) for _ in range(6)]
    _assert_same(OPS.stream_sum([o.cuda() for o in outs], 2), OPS.stream_sum(outs, 2))


KINDS = {
    "sgd": dict(lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": dict(lr=0.01, weight_decay=0.1),
    "adamw": dict(lr=0.01),
    "rmsprop": dict(lr=0.01, momentum=0.5, centered=True),
    "lamb": dict(lr=0.01, max_weight_norm=1.0),
}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("off_chip", [False, True], ids=["on-chip", "off-chip"])
@pytest.mark.parametrize("kind", KINDS, ids=KINDS.keys())
def test_fused_optimizer_on_cuda_matches_the_cpu(kind, off_chip):
    torch.manual_seed(0)
    cpu = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    gpu = [torch.nn.Parameter(p.detach().cuda()) for p in cpu]
    kw = dict(loss_scaling=8.0, max_grad_norm=1.5, off_chip=off_chip, chunk_elements=1024,
              first_order_momentum_accum_type=torch.float16)  # fmt: skip
    opts = [FusedOptimizer(kind, [dict(params=ps, **KINDS[kind])], **kw) for ps in (cpu, gpu)]
    K.offload_reset_stats()
    for _ in range(4):
        for p, q in zip(cpu, gpu):
            p.grad = torch.randn_like(p) * 8
            q.grad = p.grad.cuda()
        for opt in opts:
            opt.step()
    assert (K.offload_stats()["chunks"] > 0) == off_chip
    for p, q in zip(cpu, gpu):
        assert q.device.type == "cuda"
        assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
        for name, value in opts[1].state[q].items():
            if isinstance(value, torch.Tensor) and name != "step":
                assert value.device.type == ("cpu" if off_chip else "cuda")
                assert value.is_pinned() == off_chip
                assert_close(value.cpu(), opts[0].state[p][name], rtol=2e-3, atol=1e-5)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("off_chip", [False, True], ids=["on-chip", "off-chip"])
def test_two_stage_training_model_on_cuda_matches_eager(off_chip):
    model = _TwoStages(width=16)
    reference = copy.deepcopy(model)
    opts = _pipelined_options(ga=4, on_chip_optimizer=not off_chip)
    training = poptorch.trainingModel(
        model, opts, poptorch.optim.AdamW(model.parameters(), lr=0.01, max_grad_norm=0.5)
    )
    ref_opt = poptorch.optim.AdamW(reference.parameters(), lr=0.01)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    for _ in range(2):
        out, loss = training(x, y)
        outs = train_reference(reference, ref_opt, (x, y), 2, 4, 1, clip=0.5)
        assert out.device.type == "cpu" and loss.device.type == "cpu"
        assert_close(loss, sum(o[1] for d in outs for a in d for o in a))
    assert {p.device.type for p in training._executable.trainer.params} == {"cuda"}
    # CUDA's float32 sums round differently from the CPU's (SGD in this model: weights 1.5e-8
    # apart), and Adam divides each gradient by its own running magnitude, so a gradient
    # element near zero turns that rounding into a step of its own: 1.2e-5 on one element of
    # fc2.weight (H200, max_grad_norm 0.5). Hence Adam's tolerance here.
    for name, param in reference.named_parameters():
        assert_close(
            model.get_parameter(name).cpu(),
            param,
            rtol=1e-5,
            atol=5e-5,
            msg=lambda m, name=name: f"{name}: {m}",
        )


def test_generic_increment_steps_matches_the_cpu_kernel() -> None:
    ours = [torch.tensor(3.0), torch.tensor(0.0, dtype=torch.float64), torch.tensor([7.0])]
    theirs = [t.clone() for t in ours]
    assert G.increment_steps_(ours) == torch.ops.poptorch_sim.increment_steps_(theirs)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert [float(t) for t in ours] == [4.0, 1.0, 8.0]
