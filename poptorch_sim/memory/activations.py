"""Bytes each stage saves for backward per micro-batch, estimated at compile on fake tensors.

Each stage's forward runs once, in pipeline order, on fake tensors (``FakeTensorMode``): shapes,
dtypes, strides, devices and aliasing are those of the real run, but nothing is computed or
allocated, so a large model costs no more than a small one. (Fake rather than ``meta`` tensors,
because captured graphs name their device: ``aten.to(x, 'cpu')`` must stay possible.)
Parameters and buffers are swapped for fake stand-ins with ``torch.func.functional_call``, so
the model is never modified. Small stages (``REAL_RUN_WORK``), and stages that cannot run on
fake tensors (data-dependent Python such as ``.item()``), run once on the first real
micro-batch instead, with their buffers and the RNG restored afterwards: both ways count the
same bytes. The counting rule is [Note: counting saved bytes] in ``saved.py``. The same run
collects the values the stage marks with ``recomputationCheckpoint`` (what a recomputing stage
keeps beside its inputs, see [Note: recomputation checkpoints] in ``runtime/checkpoints.py``),
and counts each stage's ops for the time estimate (``analysis/ops.py``): one forward serves both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call
from torch.utils import _pytree as pytree

from ..analysis.ops import OpCounter, OpTotals
from ..ipu_context import running_on_ipu
from ..logger import logger
from ..program import StageSpec
from ..runtime.checkpoints import Checkpoints
from .saved import SavedBytes, storage_key

__all__ = [
    "REAL_RUN_WORK",
    "StageActivations",
    "model_activations",
    "restoring",
    "stage_activations",
]

# Below this many (parameters × input elements) the stages run for real on the first
# micro-batch rather than on fake tensors: a 3-layer MLP costs 0.25 ms for real and 8 ms fake
# (fake tensors pay Python dispatch per op, real ones arithmetic per element).
REAL_RUN_WORK = 1 << 24


@dataclass(frozen=True)
class StageActivations:
    """What one micro-batch of a stage keeps between its forward and its backward.

    Attributes:
        stage: the stage index.
        ipu: its IPU.
        saved: bytes autograd saves for backward (without recomputation).
        inputs: bytes of the stage's tensor inputs (what pipeline recomputation keeps instead).
        method: ``"fake"`` or ``"real"`` (ran on the first micro-batch), or ``"failed: ..."``.
        checkpoints: bytes of the values marked with ``recomputationCheckpoint`` that are not
            inputs (recomputation keeps them too).
        recomputed: bytes saved for backward by the largest segment between marks of the
            recomputation in backward (an IPU recomputes one segment at a time, see [Note:
            recomputing one segment at a time] in ``estimate.py``); None: no marks, the
            same as ``saved``.
        ops: what the stage's forward of one micro-batch ran (FLOPs, bytes), for the time
            estimate; None when it did not run.
        outputs: bytes of the values the stage passes on (to later stages or the host).
    """

    stage: int
    ipu: int
    saved: int
    inputs: int
    method: str
    checkpoints: int = 0
    recomputed: int | None = None
    ops: OpTotals | None = None
    outputs: int = 0

    @property
    def recompute_saved(self) -> int:
        """Bytes one micro-batch's recomputation saves for backward."""
        return self.saved if self.recomputed is None else self.recomputed

    @property
    def kept(self) -> int:
        """Bytes a recomputing stage keeps per micro-batch: its inputs and checkpoints."""
        return self.inputs + self.checkpoints


def _differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


class _Shadows:
    """Fake stand-ins of real tensors: same shape, dtype, strides and device, no data.

    One stand-in per real tensor, so tied weights stay tied and views stay views.
    """

    def __init__(self) -> None:
        self.mode = FakeTensorMode()
        self._memo: dict[int, torch.Tensor] = {}

    def value(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) not in self._memo:
            fake = self.mode.from_tensor(value.detach())
            if value.requires_grad:
                fake.requires_grad_()
            self._memo[id(value)] = fake
        return self._memo[id(value)]

    def state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        named = [*module.named_parameters(remove_duplicate=False),
                 *module.named_buffers(remove_duplicate=False)]  # fmt: skip
        return {name: self.value(t) for name, t in named}


def _count(
    call: Callable[[], Any],
    weights: Sequence[torch.Tensor],
    training: bool,
    stashed: list[torch.Tensor] | None = None,
) -> tuple[Any, int, list[torch.Tensor]]:
    """Run ``call``: its result, the bytes autograd saved, the values it marked (``stashed``:
    run as the recomputation that substitutes them, counting its largest segment)."""
    counter = SavedBytes(storage_key(w) for w in weights)
    marks = Checkpoints(stashed)
    counting = counter.saving() if stashed is None else counter.segments()
    with running_on_ipu(), torch.set_grad_enabled(training), counting, marks:
        result = call()
    return result, counter.total() if stashed is None else counter.largest_segment(), marks.kept


def _input_bytes(values: Sequence[Any]) -> int:
    counter = SavedBytes()
    for v in values:
        counter.add(v)
    return counter.total()


def _checkpoint_bytes(args: Sequence[Any], marked: Sequence[torch.Tensor]) -> int:
    """Bytes of the marked values beyond the inputs (the runtime stashes copies of them)."""
    return _input_bytes([*args, *marked]) - _input_bytes(args)


def _stage_args(
    spec: StageSpec, values: dict[str, Any], from_stages: set[str], training: bool
) -> list[Any]:
    args = []
    for name in spec.inputs:
        value = values[name]
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if training and name in from_stages and _differentiable(value):
                value = value.requires_grad_()
        args.append(value)
    return args


def _run_stages(
    stages: Sequence[StageSpec],
    inputs: dict[str, Any],
    training: bool,
    fake: bool,
) -> list[tuple[int, int, int, int | None, OpTotals, int]]:
    shadows = _Shadows() if fake else None
    values = {k: shadows.value(v) if shadows else v for k, v in inputs.items()}
    out = []
    for spec in stages:
        from_stages = {n for n in spec.inputs if n not in inputs}
        args = _stage_args(spec, values, from_stages, training)
        state = shadows.state(spec.module) if shadows else {}
        weights = list(state.values()) if shadows else [*spec.module.parameters(),
                                                         *spec.module.buffers()]  # fmt: skip

        def call(
            spec: StageSpec = spec, args: list[Any] = args, state: dict = state, ops: Any = None
        ) -> Any:
            if shadows is not None:
                with shadows.mode, ops or OpCounter():
                    return functional_call(spec.module, state, tuple(args), strict=False)
            with ops or OpCounter():
                return spec.module(*args)

        ops = OpCounter()
        result, saved, marked = _count(functools.partial(call, ops=ops), weights, training)
        recomputed = _count(call, weights, training, marked)[1] if marked and training else None
        values.update(zip(spec.outputs, result))
        out.append((saved, _input_bytes(args), _checkpoint_bytes(args, marked), recomputed,
                    ops.totals, _input_bytes(list(result))))  # fmt: skip
    return out


def restoring(model_modules: Sequence[nn.Module], run: Callable[[], Any]) -> Any:
    """Run ``run`` on one intra-op thread and put the modules' buffers and the CPU RNG back.

    One thread, because the IPU workers have just started their own intra-op thread pools:
    with two cores and two pools a tiny forward took 200 ms instead of 0.6 ms.
    """
    buffers = [b for m in model_modules for b in m.buffers()]
    saved = [b.detach().clone() for b in buffers]
    rng = torch.get_rng_state()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run()
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)


def stage_activations(
    stages: Sequence[StageSpec], inputs: dict[str, Any], training: bool
) -> list[StageActivations]:
    """Per stage, the bytes one micro-batch saves for backward and the bytes of its inputs.

    Args:
        stages: the program's stages, in pipeline order.
        inputs: the first micro-batch's program inputs, by name.
        training: whether forward runs with autograd recording (else nothing is saved).

    Returns:
        One ``StageActivations`` per stage, in order.
    """
    modules = [s.module for s in stages]
    work = sum(p.numel() for m in modules for p in m.parameters()) * sum(
        v.numel() for v in inputs.values() if isinstance(v, torch.Tensor)
    )
    order = ("real", "fake") if work <= REAL_RUN_WORK else ("fake", "real")
    counts: list[tuple[int, int, int, int | None, OpTotals | None, int]] = [
        (0, 0, 0, None, None, 0)
    ] * len(stages)
    method = "failed"
    for attempt in order:
        try:
            if attempt == "fake":
                counts = _run_stages(stages, inputs, training, fake=True)
            else:
                counts = restoring(
                    modules, lambda: _run_stages(stages, inputs, training, fake=False)
                )
            method = attempt
            break
        except Exception as exc:  # data-dependent Python on fake tensors, a real-run failure
            logger.debug("memory estimate: the %s run failed (%s)", attempt, exc)
            method = f"failed: {type(exc).__name__}: {exc}"
    return [
        StageActivations(spec.index, spec.ipu, saved, ins, method, marked, recomputed, ops, outs)
        for spec, (saved, ins, marked, recomputed, ops, outs) in zip(stages, counts)
    ]


def model_activations(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], training: bool
) -> StageActivations:
    """The same count for a model run as one program on one IPU (``ipu`` 0, ``stage`` 0)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]

    counter = OpCounter()

    def run(fake: bool) -> tuple[int, int, int | None]:
        nonlocal counter
        counter = OpCounter()
        shadows = _Shadows() if fake else None
        vals = [shadows.value(v) if shadows else v for v in leaves]
        a, kw = pytree.tree_unflatten(vals, spec)
        state = shadows.state(model) if shadows else {}
        weights = list(state.values()) if shadows else [*model.parameters(), *model.buffers()]

        def call(ops: OpCounter | None = None) -> Any:
            if shadows is not None:
                with shadows.mode, ops or OpCounter():
                    return functional_call(model, state, tuple(a), kw, strict=False)
            with ops or OpCounter():
                return model(*a, **kw)

        _, saved, marked = _count(functools.partial(call, counter), weights, training)
        recomputed = _count(call, weights, training, marked)[1] if marked and training else None
        return saved, _checkpoint_bytes(tensors, marked), recomputed

    work = sum(p.numel() for p in model.parameters()) * sum(t.numel() for t in tensors)
    order = (False, True) if work <= REAL_RUN_WORK else (True, False)
    method, counts = "failed", (0, 0, None)
    for fake in order:
        try:
            counts = run(True) if fake else restoring([model], lambda: run(False))
            method = "fake" if fake else "real"
            break
        except Exception as exc:
            method = f"failed: {type(exc).__name__}: {exc}"
    saved, marked, recomputed = counts
    ops = counter.totals if not method.startswith("failed") else None
    return StageActivations(
        0, 0, saved, _input_bytes(tensors), method, marked, recomputed, ops=ops
    )
