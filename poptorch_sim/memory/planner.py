"""Suggests where the ``BeginBlock``s go: stages balanced by cost, each IPU under its limit.

The model runs one micro-batch forward once with hooks on the candidate modules (by default the
items of its largest ``nn.ModuleList``: transformer layers, ResNet stages). Each candidate gets
its weights, the bytes its forward saves for backward ([Note: counting saved bytes]), the bytes
of its input (what recomputation keeps) and a cost: the measured forward time, or, for a model
built on the ``meta`` device (nothing allocated, e.g. BERT-base-sized configs), its FLOPs from
``torch.utils.flop_counter``. What runs before the first candidate (embeddings) joins the first
stage, what runs after the last (the head) the last stage.

A dynamic programme then cuts the candidates into ``num_ipus`` contiguous stages, one per IPU,
minimising the slowest stage's cost subject to every IPU's estimate ([Note: what each IPU
holds], with the micro-batches in flight of the runtime's 1F1B schedule) fitting its limit.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .. import env
from ..runtime.schedules import make_schedule
from .activations import StageActivations, restoring
from .estimate import ALLOWANCE_FRACTION, activation_peaks
from .report import IpuMemory, MemoryReport
from .saved import SavedBytes, storage_key, tensor_bytes
from .settings import MemorySettings, memory_settings

__all__ = ["Plan", "plan"]

# Optimizer state bytes per float32 trainable element (on chip, before offload and RTS).
_STATE_BYTES = {"sgd": 4, "adam": 8, "adamw": 8, "lamb": 8, "rmsprop": 4, None: 0}


@dataclass(frozen=True)
class _Unit:
    name: str
    weights: int
    trainable: int  # trainable elements
    saved: int
    inputs: int
    cost: float
    tensors: int = 0  # trainable tensors (each has a 4-byte step counter in Adam-like state)


@dataclass(frozen=True)
class Plan:
    """A suggested placement: ``blocks[k]`` is the module that starts IPU ``k``'s block."""

    blocks: list[str]
    stage_costs: list[float]
    cost_unit: str
    report: MemoryReport

    def apply(self, model: nn.Module) -> nn.Module:
        """Put the suggested ``BeginBlock``s on ``model`` (in place, block ``IPU<k>`` on IPU
        ``k``; what runs before the first one joins IPU 0); returns ``model``."""
        from ..ops.blocks import BeginBlock

        for k, name in enumerate(self.blocks):
            BeginBlock(model.get_submodule(name), f"IPU{k}", ipu_id=k)
        return model

    @property
    def fits(self) -> bool:
        """Whether every IPU of the placement fits its limit."""
        return not self.report.over_limit

    def __str__(self) -> str:
        total = sum(self.stage_costs) or 1.0
        lines = ["Suggested placement (BeginBlock at each module):"]
        for k, (name, cost) in enumerate(zip(self.blocks, self.stage_costs)):
            share = 100 * cost / total
            lines.append(f"  IPU {k}: {name:<32} {share:5.1f}% of the {self.cost_unit}")
        lines.append(str(self.report))
        return "\n".join(lines)


def _candidates(model: nn.Module) -> list[str]:
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return [n for n, _ in model.named_children()]
    name, largest = max(lists, key=lambda nm: len(nm[1]))
    return [f"{name}.{i}" for i in range(len(largest))]


class _Recorder:
    """Forward hooks: each candidate's saved bytes, input bytes and time, and which modules
    outside the candidates ran before the first candidate or after it."""

    def __init__(self, excluded: set[int]) -> None:
        self.excluded = excluded
        self.outer = SavedBytes(excluded)  # what is saved outside the candidates
        self.before: int | None = None  # outer's bytes when the first candidate started
        self.found: dict[str, dict[str, Any]] = {}
        self.sides: dict[str, list[nn.Module]] = {"before": [], "after": []}

    def pre(self, name: str, args: tuple[Any, ...]) -> None:
        if self.before is None:
            self.before = self.outer.total()
        counter = SavedBytes(self.excluded)
        ctx = counter.saving()
        ctx.__enter__()  # inner hooks take precedence over outer's until post
        inputs = SavedBytes()
        for v in args:
            inputs.add(v)
        self.found[name] = {"ctx": ctx, "counter": counter, "inputs": inputs.total()}

    def post(self, name: str) -> None:
        self.found[name]["ctx"].__exit__(None, None, None)

    def side(self, module: nn.Module) -> None:
        self.sides["before" if self.before is None else "after"].append(module)

    def hook(self, model: nn.Module, names: Sequence[str]) -> list[Any]:
        modules = [model.get_submodule(n) for n in names]
        handles = []
        for name, module in zip(names, modules):
            handles.append(module.register_forward_pre_hook(
                lambda _m, a, name=name: self.pre(name, a)))  # fmt: skip
            handles.append(module.register_forward_hook(
                lambda _m, _a, _o, name=name: self.post(name)))  # fmt: skip
        inner = {id(m) for c in modules for m in c.modules()}
        for m in model.modules():
            direct = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
            if id(m) not in inner and direct:
                handles.append(m.register_forward_pre_hook(lambda m_, _a: self.side(m_)))
        return handles


def _profile(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], names: Sequence[str]
) -> tuple[list[_Unit], _Unit, _Unit]:
    """Run forward once with hooks; the candidates, then what ran before and after them."""
    meta = any(p.is_meta for p in model.parameters())
    modules = [model.get_submodule(n) for n in names]
    weights = {id(p) for m in modules for p in [*m.parameters(), *m.buffers()]}
    rec = _Recorder({storage_key(t) for t in [*model.parameters(), *model.buffers()]})
    flops = FlopCounterMode(display=False)
    handles = rec.hook(model, names)

    def run() -> None:
        with rec.outer.saving(), torch.enable_grad(), flops if meta else nullcontext():
            model(*args, **kwargs)

    try:
        if meta:
            run()
        else:
            restoring([model], run)
    finally:
        for h in handles:
            h.remove()
    if meta:
        root = type(model).__name__
        counts = {k.removeprefix(f"{root}."): v for k, v in flops.get_flop_counts().items()}
        costs = {n: float(sum(counts.get(n, {}).values())) for n in names}
    else:
        costs = restoring([model], lambda: _forward_times(model, args, kwargs, names, modules))
    units = []
    for name, module in zip(names, modules):
        entry = rec.found[name]
        params = [p for p in module.parameters() if p.requires_grad]
        units.append(_Unit(name, sum(tensor_bytes(t) for t in [*module.parameters(),
                                                             *module.buffers()]),
                           sum(p.numel() for p in params), entry["counter"].total(),
                           entry["inputs"], costs[name], len(params)))  # fmt: skip
    before = rec.before or 0
    head = _rest("(before)", rec.sides["before"], weights, before)
    tail = _rest("(after)", rec.sides["after"], weights, max(rec.outer.total() - before, 0))
    return units, head, tail


def _rest(name: str, modules: list[nn.Module], inside: set[int], saved: int) -> _Unit:
    """The modules outside the candidates that ran before (or after) them, as one unit.

    A weight used on both sides (a head tied to the embedding) counts on both, as the IPUs of
    both hold it.
    """
    seen: dict[int, torch.Tensor] = {}
    for m in modules:
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
            if id(t) not in inside:
                seen[id(t)] = t
    trainable = [t for t in seen.values() if isinstance(t, nn.Parameter) and t.requires_grad]
    return _Unit(name, sum(tensor_bytes(t) for t in seen.values()),
                 sum(t.numel() for t in trainable), saved, 0, 0.0, len(trainable))  # fmt: skip


def _forward_times(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    names: Sequence[str],
    modules: Sequence[nn.Module],
    repeats: int = 3,
) -> dict[str, float]:
    """Per candidate, the fastest of ``repeats`` forward times (seconds; no autograd)."""
    best = dict.fromkeys(names, float("inf"))
    started: dict[str, float] = {}
    handles = []
    for name, module in zip(names, modules):

        def pre(_m: nn.Module, _a: Any, name: str = name) -> None:
            started[name] = time.perf_counter()

        def post(_m: nn.Module, _a: Any, _o: Any, name: str = name) -> None:
            best[name] = min(best[name], time.perf_counter() - started[name])

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        with torch.no_grad():
            for _ in range(repeats):
                model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return best


def _stage(units: Sequence[_Unit], name: str) -> _Unit:
    return _Unit(
        name,
        sum(u.weights for u in units),
        sum(u.trainable for u in units),
        sum(u.saved for u in units),
        units[0].inputs,
        sum(u.cost for u in units),
        sum(u.tensors for u in units),
    )


@functools.cache
def _in_flight(num_stages: int, micro_batches: int) -> dict[int, int]:
    """Per stage, the most micro-batches in flight under the runtime's 1F1B schedule."""
    schedule = make_schedule("1f1b", num_stages, micro_batches, training=True)
    acts = [StageActivations(k, k, 1, 1, "planner") for k in range(num_stages)]
    return activation_peaks(schedule, acts, recompute=False)[1]


def _memory(
    stages: Sequence[_Unit], settings: MemorySettings, kind: str | None, limit: int
) -> list[IpuMemory]:
    flight = _in_flight(len(stages), settings.gradient_accumulation)
    # One stage per IPU: the peak is at its first backward, with every micro-batch in flight
    # held (and, recomputing, one micro-batch's activations again on top).
    peaks = {
        k: s.inputs * flight[k] + s.saved if settings.recompute else s.saved * flight[k]
        for k, s in enumerate(stages)
    }
    out = []
    for k, s in enumerate(stages):
        accumulate = settings.gradient_accumulation > 1
        steps = 4 * s.tensors if kind in ("adam", "adamw", "lamb", "rmsprop") else 0
        state = s.trainable * _STATE_BYTES.get(kind, 8) + steps
        if settings.rts:
            state = -(-state // settings.replicas)
        out.append(IpuMemory(
            ipu=k, stages=(k,), weights=s.weights,
            gradients=4 * s.trainable if accumulate else 0,
            optimizer_state=0 if settings.off_chip else state,
            activations=peaks[k], allowance=int(ALLOWANCE_FRACTION * limit), limit=limit,
            optimizer_state_off_chip=state if settings.off_chip else 0,
            activations_per_micro_batch={k: s.inputs if settings.recompute else s.saved},
            in_flight={k: flight.get(k, 0)},
        ))  # fmt: skip
    return out


def plan(
    model: nn.Module,
    inputs: tuple[Any, ...] | dict[str, Any],
    options: Any,
    num_ipus: int,
    *,
    optimizer: str | None = "adam",
    candidates: Sequence[str] | None = None,
) -> Plan:
    """Suggest ``BeginBlock`` positions for ``num_ipus`` pipeline stages, one per IPU.

    Args:
        model: the model (on the ``meta`` device for a configuration too large to build: the
            cost is then FLOPs, else the measured forward time).
        inputs: one micro-batch: positional arguments, or keyword arguments as a dict.
        options: ``poptorch.Options`` (gradient accumulation, replicas, offload, RTS,
            recomputation).
        num_ipus: how many stages / IPUs.
        optimizer: ``"sgd"`` (with momentum), ``"adam"``, ``"adamw"``, ``"lamb"``,
            ``"rmsprop"`` or None (float32 state sizes).
        candidates: module names where a block may start (default: the items of the model's
            largest ``nn.ModuleList``).

    Returns:
        The ``Plan``: ``print(plan)`` shows the placement and the predicted memory per IPU.

    Raises:
        ValueError: fewer candidates than IPUs.

    >>> # with torch.device("meta"): bert = transformers.BertForSequenceClassification(config)
    >>> # print(plan(bert, {"input_ids": ids}, opts, 4, optimizer="lamb"))  # then .apply(bert)
    """
    names = list(candidates) if candidates is not None else _candidates(model)
    if len(names) < num_ipus:
        raise ValueError(
            f"plan() needs at least as many candidate modules as IPUs: {len(names)} candidates "
            f"({names}) for num_ipus={num_ipus}; pass candidates=[...]"
        )
    args, kwargs = (tuple(), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})
    units, head, tail = _profile(model, args, kwargs, names)
    settings = memory_settings(options, training=True)
    limit = env.ipu_memory()
    cuts = _partition(units, head, tail, num_ipus, settings, optimizer, limit)
    stages = _stages(units, head, tail, cuts)
    report = MemoryReport(
        _memory(stages, settings, optimizer, limit), "1f1b", settings.gradient_accumulation,
        {"replicas": settings.replicas, "optimizer": optimizer, "offload": settings.off_chip,
         "RTS": settings.rts, "recomputation": settings.recompute},
        [f"allowance = {ALLOWANCE_FRACTION:.0%} of the limit (code, exchange buffers)",
         "planner estimate: float32 gradient accumulators and optimizer state"],
    )  # fmt: skip
    unit = "FLOPs" if any(p.is_meta for p in model.parameters()) else "forward time"
    return Plan([names[c] for c in cuts], [s.cost for s in stages], unit, report)


def _stages(units: list[_Unit], head: _Unit, tail: _Unit, cuts: list[int]) -> list[_Unit]:
    bounds = [*cuts, len(units)]
    stages = []
    for k in range(len(cuts)):
        group = units[bounds[k] : bounds[k + 1]]
        if k == 0:
            group = [head, *group]
        if k == len(cuts) - 1:
            group = [*group, tail]
        stages.append(_stage(group, group[0].name))
    return stages


def _partition(
    units: list[_Unit],
    head: _Unit,
    tail: _Unit,
    k: int,
    settings: MemorySettings,
    kind: str | None,
    limit: int,
) -> list[int]:
    """First unit of each stage: min over cuts of the slowest stage, among those that fit
    (or, if none fits, of the largest IPU total)."""
    n = len(units)
    best: dict[tuple[int, int], tuple[tuple[float, float], list[int]]] = {}

    def score(start: int, end: int, s: int) -> tuple[float, float]:
        group = units[start:end]
        if s == 0:
            group = [head, *group]
        if s == k - 1:
            group = [*group, tail]
        stage = _stage(group, "")
        stub = [stage] * k  # the in-flight count depends only on the stage's position
        mem = _memory(stub, settings, kind, limit)[s]
        return (0.0 if mem.total <= limit else 1.0) * mem.total, stage.cost

    for end in range(1, n - k + 2):
        best[(1, end)] = (score(0, end, 0), [0])
    for s in range(1, k):
        for end in range(s + 1, n - (k - s) + 2):
            options_ = []
            for start in range(s, end):
                if (s, start) not in best:
                    continue
                (over, cost), cuts = best[(s, start)]
                o2, c2 = score(start, end, s)
                options_.append(((max(over, o2), max(cost, c2)), [*cuts, start]))
            if options_:
                best[(s + 1, end)] = min(options_, key=lambda x: x[0])
    return best[(k, n)][1]
