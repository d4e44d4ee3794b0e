"""Outputs of a call: which micro-batches are kept per ``OutputMode`` and how they are joined.

For an output traced with shape ``S`` on one micro-batch (reference §2.3):

    mode      kept micro-batches (order [DI, GA, R])      batch dim b      returned shape
    All       every one                                   DI·GA·R          S[0]·b (0-d: [b])
    EveryN(P) device iterations P-1, 2P-1, ...            DI·GA·R / P      S[0]·b
    Final     the last one of each replica                R                S[0]·R
    Sum       per replica, elementwise sum of DI·GA       R                S[0]·R
              (b == 1 returns exactly S)

int64 outputs come back as int32 and float64 as float32, as from an IPU.
"""

from __future__ import annotations

from typing import Any

import torch

from ..enums import OutputMode
from ..errors import Error
from .batching import Layout

__all__ = ["OutputCollector", "BACKWARD_ERROR", "block_backward", "demote"]

BACKWARD_ERROR = (
    "backward() cannot be called explicitly on outputs of a PopTorch model. If you're using a "
    "trainingModel, the backwards pass is performed automatically when invoking the model. If "
    "you're using an inferenceModel, you should use a trainingModel instead."
)

_DEMOTED = {torch.int64: torch.int32, torch.float64: torch.float32}


def demote(t: torch.Tensor) -> torch.Tensor:
    """The tensor as an IPU returns it (int64 → int32, float64 → float32)."""
    target = _DEMOTED.get(t.dtype)
    return t.to(target) if target is not None else t


def _raise_backward(*args: Any, **kwargs: Any) -> None:
    raise Error(BACKWARD_ERROR)


def block_backward(t: torch.Tensor) -> torch.Tensor:
    """Make ``t.backward()`` raise PopTorch's error."""
    t.backward = _raise_backward  # type: ignore[method-assign]
    return t


class OutputCollector:
    """Keeps the micro-batch outputs an ``OutputMode`` needs, then joins them."""

    def __init__(self, mode: OutputMode, period: int, layout: Layout) -> None:
        di = layout.device_iterations
        if mode == OutputMode.EveryN and (period > di or di % period != 0):
            raise Error(
                f"Return period must be a factor of the number of batches per step and <= to "
                f"it: output_return_period={period}, deviceIterations={di}"
            )
        self._mode = mode
        self._period = period
        self._layout = layout
        self._last = (di - 1, layout.gradient_accumulation - 1)
        self._kept: list[list[Any]] = []
        self._sums: list[list[torch.Tensor]] | None = None

    def wants(self, d: int, a: int) -> bool:
        """Whether the outputs of device iteration ``d``, step ``a`` are kept."""
        if self._mode in (OutputMode.All, OutputMode.Sum):
            return True
        if self._mode == OutputMode.EveryN:
            return (d + 1) % self._period == 0
        return (d, a) == self._last

    def add(self, r: int, leaves: list[Any]) -> None:
        """Record the output leaves of one micro-batch of replica ``r`` (call in [DI,GA,R] order)."""
        if self._mode != OutputMode.Sum:
            self._kept.append(leaves)
            return
        if self._sums is None:
            self._sums = [[] for _ in range(self._layout.replicas)]
        sums = self._sums[r]
        if not sums:
            sums.extend(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in leaves)
        else:
            for s, t in zip(sums, leaves):
                if isinstance(s, torch.Tensor):
                    s.add_(t)

    def result(self) -> list[Any]:
        """The joined output leaves."""
        rows = self._sums if self._mode == OutputMode.Sum else self._kept
        if not rows:
            return []
        joined = []
        for i, first in enumerate(rows[0]):
            if not isinstance(first, torch.Tensor):
                joined.append(first)
                continue
            parts = [row[i] for row in rows]
            if len(parts) == 1:
                out = parts[0]
            elif first.dim() == 0:
                out = torch.stack(parts)
            else:
                out = torch.cat(parts)
            joined.append(block_backward(demote(out.detach())))
        return joined
