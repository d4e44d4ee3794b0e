"""Profiles the modules where a ``BeginBlock`` may go: what each holds and what it costs.

One forward of one micro-batch runs with hooks on the candidate modules (by default the items
of the model's largest ``nn.ModuleList``: transformer layers, ResNet stages). Each candidate
gets its weights, the bytes its forward saves for backward ([Note: counting saved bytes]), the
bytes of its input and of the values it marks with ``recomputationCheckpoint`` (what a
recomputing stage keeps), the saved bytes of each segment between its marks (what a recomputing
stage holds again in backward, one segment at a time: [Note: recomputing one segment at a
time] in ``estimate.py``) and a cost: the measured forward time, or, for a model built on the
``meta`` device (nothing allocated), its FLOPs from ``torch.utils.flop_counter``. What runs
before the first candidate (embeddings) and after the last (the head) is profiled as two more
units, ``(before)`` and ``(after)``. ``placement.py`` cuts the units into stages.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..runtime.checkpoints import is_checkpoint
from .activations import restoring
from .saved import SavedBytes, storage_key, tensor_bytes

__all__ = [
    "Candidates",
    "Unit",
    "candidate_names",
    "join",
    "planner_request",
    "profile_candidates",
]


@dataclass(frozen=True)
class Unit:
    """What one candidate module (or a stage of them) holds and costs, per micro-batch.

    Attributes:
        name: the module (a stage: its first module).
        weights: bytes of its parameters and buffers.
        trainable: trainable elements.
        saved: bytes its forward saves for backward.
        inputs: bytes of its input.
        cost: the cost the placement balances (seconds or FLOPs).
        tensors: trainable tensors (each has a 4-byte step counter in Adam-like state).
        checkpoints: bytes of the values it marks with ``recomputationCheckpoint``.
        segments: the saved bytes of each run between its marks, in order (one: no marks).
    """

    name: str
    weights: int
    trainable: int
    saved: int
    inputs: int
    cost: float
    tensors: int = 0
    checkpoints: int = 0
    segments: tuple[int, ...] = ()

    @property
    def recomputed(self) -> int | None:
        """Saved bytes of the largest segment (None without marks: the whole ``saved``)."""
        return max(self.segments) if len(self.segments) > 1 else None


def join(units: Sequence[Unit], name: str) -> Unit:
    """The units run one after another as one stage: the first one's input, the sums of the
    rest; a unit's last segment and the next one's first are one segment (no mark between)."""
    segments: list[int] = []
    for u in units:
        parts = list(u.segments) or [u.saved]
        if segments:
            segments[-1] += parts.pop(0)
        segments += parts
    return Unit(
        name,
        sum(u.weights for u in units),
        sum(u.trainable for u in units),
        sum(u.saved for u in units),
        units[0].inputs,
        sum(u.cost for u in units),
        sum(u.tensors for u in units),
        sum(u.checkpoints for u in units),
        tuple(segments),
    )


@dataclass(frozen=True)
class Candidates:
    """The profiled candidates, in the order the forward runs them.

    Attributes:
        names: the candidate modules.
        units: one ``Unit`` per name.
        head: what runs before the first candidate (joins the first stage).
        tail: what runs after the last candidate (joins the last stage).
    """

    names: list[str]
    units: list[Unit]
    head: Unit
    tail: Unit

    def with_costs(self, costs: Mapping[str, float]) -> Candidates:
        """The same candidates costed by ``costs`` (a cost per name, ``(before)`` and
        ``(after)``)."""

        def costed(u: Unit) -> Unit:
            return dataclasses.replace(u, cost=costs[u.name])

        return Candidates(
            self.names, [costed(u) for u in self.units], costed(self.head), costed(self.tail)
        )

    def stages(self, cuts: Sequence[int]) -> list[Unit]:
        """The stages that start at units ``cuts`` (the first is 0), head and tail joined."""
        bounds = [*cuts, len(self.units)]
        return [
            self.stage(bounds[k], bounds[k + 1], first=k == 0, last=k == len(cuts) - 1)
            for k in range(len(cuts))
        ]

    def stage(self, start: int, end: int, first: bool, last: bool) -> Unit:
        """Units ``start:end`` as one stage (with the head if ``first``, the tail if ``last``)."""
        group = self.units[start:end]
        if first:
            group = [self.head, *group]
        if last:
            group = [*group, self.tail]
        return join(group, group[0].name)


def candidate_names(model: nn.Module) -> list[str]:
    """The items of the model's largest ``nn.ModuleList`` (else its children)."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return [n for n, _ in model.named_children()]
    name, largest = max(lists, key=lambda nm: len(nm[1]))
    return [f"{name}.{i}" for i in range(len(largest))]


def planner_request(
    caller: str,
    model: nn.Module,
    inputs: tuple[Any, ...] | dict[str, Any],
    num_ipus: int,
    candidates: Sequence[str] | None,
) -> tuple[list[str], tuple[Any, ...], dict[str, Any]]:
    """The candidate names and the inputs as ``(args, kwargs)`` of a planner's call
    (``caller``: its name, for the error).

    Raises:
        ValueError: fewer candidates than IPUs.
    """
    names = list(candidates) if candidates is not None else candidate_names(model)
    if len(names) < num_ipus:
        raise ValueError(
            f"{caller}() needs at least as many candidate modules as IPUs: {len(names)} "
            f"candidates ({names}) for num_ipus={num_ipus}; pass candidates=[...]"
        )
    if isinstance(inputs, dict):
        return names, (), dict(inputs)
    return names, tuple(inputs), {}


class _Recorder:
    """Forward hooks: each candidate's saved bytes (by segment), input bytes and marked values,
    and which modules outside the candidates ran before the first candidate or after it.

    A mark outside every candidate (``x = checkpoint(layer(x))`` in the parent's forward) ends
    the candidate that ran last: its value is kept with that candidate, and the segment that
    candidate's recomputation starts ends with it.
    """

    def __init__(self, excluded: set[int]) -> None:
        self.excluded = excluded
        self.outer = SavedBytes(excluded)  # what is saved outside the candidates
        self.before: int | None = None  # outer's bytes when the first candidate started
        self.found: dict[str, dict[str, Any]] = {}
        self.sides: dict[str, list[nn.Module]] = {"before": [], "after": []}
        self.running: list[str] = []  # the candidates whose forward is running
        self.last: str | None = None  # the candidate that ended last

    def pre(self, name: str, args: tuple[Any, ...]) -> None:
        if self.before is None:
            self.before = self.outer.total()
        counter = SavedBytes(self.excluded)
        ctx = counter.saving()
        ctx.__enter__()  # inner hooks take precedence over outer's until post
        inputs = SavedBytes()
        for v in args:
            inputs.add(v)
        self.found[name] = {"ctx": ctx, "counter": counter, "inputs": inputs.total(),
                            "marked": 0, "ends_marked": False}  # fmt: skip
        self.running.append(name)

    def post(self, name: str) -> None:
        self.found[name]["ctx"].__exit__(None, None, None)
        self.running.pop()
        self.last = name

    def mark(self, value: torch.Tensor) -> None:
        """A ``recomputationCheckpoint``'s value (see the class docstring)."""
        owner = self.running[-1] if self.running else self.last
        if owner is None:
            return  # before every candidate: the first stage's input, kept anyway
        entry = self.found[owner]
        entry["marked"] += tensor_bytes(value)
        if self.running:
            entry["counter"].cut()
        else:
            entry["ends_marked"] = True

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

    def unit(self, name: str, module: nn.Module, cost: float) -> Unit:
        entry = self.found[name]
        params = [p for p in module.parameters() if p.requires_grad]
        segments = entry["counter"].segment_bytes() + ([0] if entry["ends_marked"] else [])
        return Unit(
            name, sum(tensor_bytes(t) for t in [*module.parameters(), *module.buffers()]),
            sum(p.numel() for p in params), entry["counter"].total(), entry["inputs"], cost,
            len(params), entry["marked"], tuple(segments),
        )  # fmt: skip


class _Marks(TorchFunctionMode):
    """Hands each ``recomputationCheckpoint``'s value to the recorder."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self._recorder = recorder

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        if is_checkpoint(func) and isinstance(result, torch.Tensor):
            self._recorder.mark(result)
        return result


def profile_candidates(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], names: Sequence[str]
) -> Candidates:
    """Run one forward with hooks; the candidates, then what ran before and after them.

    Args:
        model: the model (on the ``meta`` device: costs are FLOPs, else forward seconds).
        args: one micro-batch's positional inputs.
        kwargs: its keyword inputs.
        names: the candidate modules, in the order the forward runs them.
    """
    meta = any(p.is_meta for p in model.parameters())
    modules = [model.get_submodule(n) for n in names]
    weights = {id(p) for m in modules for p in [*m.parameters(), *m.buffers()]}
    rec = _Recorder({storage_key(t) for t in [*model.parameters(), *model.buffers()]})
    from torch.utils.flop_counter import FlopCounterMode  # imports triton: on first use

    flops = FlopCounterMode(display=False)
    handles = rec.hook(model, names)

    def run() -> None:
        with (
            rec.outer.saving(),
            torch.enable_grad(),
            flops if meta else nullcontext(),
            _Marks(rec),
        ):
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
    units = [rec.unit(name, module, costs[name]) for name, module in zip(names, modules)]
    before = rec.before or 0
    head = _rest("(before)", rec.sides["before"], weights, before)
    tail = _rest("(after)", rec.sides["after"], weights, max(rec.outer.total() - before, 0))
    return Candidates(list(names), units, head, tail)


def _rest(name: str, modules: list[nn.Module], inside: set[int], saved: int) -> Unit:
    """The modules outside the candidates that ran before (or after) them, as one unit.

    A weight used on both sides (a head tied to the embedding) counts on both, as the IPUs of
    both hold it. Values they mark are not looked for: one segment.
    """
    seen: dict[int, torch.Tensor] = {}
    for m in modules:
        for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
            if id(t) not in inside:
                seen[id(t)] = t
    trainable = [t for t in seen.values() if isinstance(t, nn.Parameter) and t.requires_grad]
    return Unit(name, sum(tensor_bytes(t) for t in seen.values()),
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
