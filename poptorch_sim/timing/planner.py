"""Suggests ``BeginBlock`` positions by predicted IPU time: the fastest pipeline that fits.

The memory planner's two halves do the work: ``memory/candidates.py`` profiles the candidate
modules (weights, bytes saved for backward) and ``memory/placement.py`` cuts them into
contiguous stages, minimising the slowest stage's cost among the cuts that fit. Here each
candidate's cost is its predicted IPU seconds per micro-batch
(``timing/estimate.py``: its ops counted in one forward, at the IPU version of the options;
forward, backward and, when the pipeline recomputes, a second forward), so minimising the
slowest stage minimises the predicted step, ``(GA + 2(N - 1)) × the slowest stage``. The
user's own split (the candidates that already start a block) is costed the same way, and the
plan states the predicted speedup over it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..analysis.ops import OpCounter, OpTotals
from ..memory.activations import restoring
from ..memory.candidates import planner_request, profile_candidates
from ..memory.placement import Plan, place
from ..ops.blocks import block_hooks, removeBlocks
from .estimate import pass_cost, pipeline_cycles
from .settings import time_settings

__all__ = ["TimePlan", "plan_time"]


class _ByModule(OpCounter):
    """An ``OpCounter`` that adds each op to the candidate running it (or to before / after)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__()
        self.by_name = {n: OpTotals() for n in [*names, "(before)", "(after)"]}
        self.stack: list[str] = []
        self.seen_any = False

    def hook(self, model: nn.Module, names: Sequence[str]) -> list[Any]:
        handles = []
        for name in names:
            module = model.get_submodule(name)
            handles.append(module.register_forward_pre_hook(
                lambda _m, _a, name=name: self._enter(name)))  # fmt: skip
            handles.append(module.register_forward_hook(lambda _m, _a, _o: self._leave()))
        return handles

    def _enter(self, name: str) -> None:
        self.stack.append(name)
        self.seen_any = True

    def _leave(self) -> None:  # a forward hook's None keeps the module's output
        self.stack.pop()

    def _record(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        self.totals = OpTotals()
        super()._record(func, args, kwargs, out)
        where = self.stack[-1] if self.stack else ("(after)" if self.seen_any else "(before)")
        self.by_name[where].add(self.totals)


@dataclass(frozen=True)
class TimePlan:
    """A placement by predicted time, and the user's own placement beside it.

    Attributes:
        plan: the placement (``blocks``, ``stage_costs`` in predicted seconds per micro-batch,
            the memory report).
        step_seconds: the predicted pipeline time of one step with it.
        user_blocks: the candidates that start a block in the user's model (None: the model
            has no block on the candidates, or not one per IPU).
        user_step_seconds: the same prediction for the user's placement.
    """

    plan: Plan
    step_seconds: float
    user_blocks: list[str] | None = None
    user_step_seconds: float | None = None

    @property
    def blocks(self) -> list[str]:
        """The module that starts each IPU's block."""
        return self.plan.blocks

    @property
    def speedup(self) -> float | None:
        """Predicted step time of the user's placement over this one's (None: no user split)."""
        if self.user_step_seconds is None or self.step_seconds <= 0:
            return None
        return self.user_step_seconds / self.step_seconds

    def apply(self, model: nn.Module) -> nn.Module:
        """Remove the model's blocks and put the suggested ones on it; returns ``model``."""
        removeBlocks(model)
        return self.plan.apply(model)

    def __str__(self) -> str:
        lines = [str(self.plan).replace("of the IPU seconds", "of the predicted time")]
        lines.append(f"predicted pipeline time per step: {1e3 * self.step_seconds:.3f} ms")
        if self.speedup is not None:
            lines.append(
                f"your placement {self.user_blocks}: {1e3 * self.user_step_seconds:.3f} ms "
                f"per step; the suggested one is predicted {self.speedup:.2f}x as fast"
            )
        return "\n".join(lines)


def _seconds(model: nn.Module, args: tuple, kwargs: dict, names: Sequence[str],
             settings: Any) -> dict[str, float]:  # fmt: skip
    """Predicted seconds per micro-batch of each candidate (forward + backward + recompute)."""
    counter = _ByModule(names)
    handles = counter.hook(model, names)
    meta = any(p.is_meta for p in model.parameters())
    try:
        with torch.enable_grad(), counter:
            if meta:
                model(*args, **kwargs)
            else:
                restoring([model], lambda: model(*args, **kwargs))
    finally:
        for h in handles:
            h.remove()
    passes = 1.0 + 2.0 + (1.0 if settings.recompute else 0.0)
    return {
        name: passes * pass_cost(ops, settings.hardware).total
        for name, ops in counter.by_name.items()
    }


def _user_cuts(model: nn.Module, names: Sequence[str], num_ipus: int) -> list[int] | None:
    cuts = [i for i, n in enumerate(names) if block_hooks(model.get_submodule(n))]
    if cuts and cuts[0] != 0:
        cuts = [0, *cuts]
    return cuts if len(cuts) == num_ipus else None


def plan_time(
    model: nn.Module,
    inputs: tuple[Any, ...] | dict[str, Any],
    options: Any,
    num_ipus: int,
    *,
    optimizer: str | None = "adam",
    candidates: Sequence[str] | None = None,
) -> TimePlan:
    """Suggest ``BeginBlock`` positions that minimise the predicted step time among those
    that fit, and compare them with the model's own blocks.

    Args:
        model: the model (on the ``meta`` device for a configuration too large to build).
        inputs: one micro-batch: positional arguments, or keyword arguments as a dict.
        options: ``poptorch.Options`` (IPU version, gradient accumulation, replicas, offload,
            RTS, recomputation).
        num_ipus: how many stages / IPUs.
        optimizer: as ``poptorch_sim.memory.plan``.
        candidates: module names where a block may start (default: the items of the model's
            largest ``nn.ModuleList``).

    Returns:
        The ``TimePlan``: ``print`` it; ``.speedup`` over the user's blocks; ``.apply(model)``.

    Raises:
        ValueError: fewer candidates than IPUs.
        Error: an unknown IPU version.

    >>> # suggestion = plan_time(net, (x, y), opts, 4); print(suggestion); suggestion.apply(net)
    """
    names, args, kwargs = planner_request("plan_time", model, inputs, num_ipus, candidates)
    settings = time_settings(options, True, "pipelined", num_ipus)
    seconds = _seconds(model, args, kwargs, names, settings)
    profiled = profile_candidates(model, args, kwargs, names).with_costs(seconds)
    plan = place(profiled, num_ipus, options, optimizer, "IPU seconds")
    cycles = pipeline_cycles("pipelined", num_ipus, settings.gradient_accumulation, True)
    step = cycles * max(plan.stage_costs)
    user = _user_cuts(model, names, num_ipus)
    user_step = None
    if user is not None:
        user_step = cycles * max(s.cost for s in profiled.stages(user))
    user_names = None if user is None else [names[c] for c in user]
    return TimePlan(plan, step, user_names, user_step)
