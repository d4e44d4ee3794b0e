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

import time
from typing import Any

import torch

from ..enums import OutputMode
from ..errors import Error
from ..runtime.dtypes import host_dtype
from .host_buffers import OutputBuffers
from .layout import Layout
from .streams import assemble

__all__ = ["OutputCollector", "BACKWARD_ERROR", "block_backward", "demote"]

BACKWARD_ERROR = (
    "backward() cannot be called explicitly on outputs of a PopTorch model. If you're using a "
    "trainingModel, the backwards pass is performed automatically when invoking the model. If "
    "you're using an inferenceModel, you should use a trainingModel instead."
)


def demote(t: torch.Tensor) -> torch.Tensor:
    """The tensor as an IPU returns it (int64 → int32, float64 → float32)."""
    return t.to(host_dtype(t.dtype))


def _raise_backward(*args: Any, **kwargs: Any) -> None:
    raise Error(BACKWARD_ERROR)


def block_backward(t: torch.Tensor) -> torch.Tensor:
    """Make ``t.backward()`` raise PopTorch's error."""
    t.backward = _raise_backward  # type: ignore[method-assign]
    return t


class OutputCollector:
    """Gathers every micro-batch's output leaves, then joins each leaf per ``OutputMode``.

    The joining is the device-iteration output stream
    (``poptorch_sim.executor.streams.assemble``): at most one copy per output, into
    ``buffers`` when given (see [Note: output buffers are reused]).
    """

    def __init__(
        self,
        mode: OutputMode,
        period: int,
        layout: Layout,
        buffers: OutputBuffers | None = None,
    ) -> None:
        di = layout.device_iterations
        if mode == OutputMode.EveryN and (period > di or di % period != 0):
            raise Error(
                f"Return period must be a factor of the number of batches per step and <= to "
                f"it: output_return_period={period}, deviceIterations={di}"
            )
        self._mode = mode.name
        self._period = period
        self._layout = layout
        self._empty = buffers.empty if buffers is not None else None
        self._rows: list[list[Any]] = []
        self.times: list[float] = []  # when each micro-batch's outputs arrived (perf.py)

    def add(self, leaves: list[Any]) -> None:
        """Record the output leaves of the next micro-batch (call in [DI, GA, R] order)."""
        self._rows.append(leaves)
        self.times.append(time.perf_counter())

    @property
    def num_outputs(self) -> int:
        """How many output tensors each micro-batch produced."""
        return sum(isinstance(t, torch.Tensor) for t in self._rows[0]) if self._rows else 0

    def result(self) -> list[Any]:
        """The joined output leaves."""
        if not self._rows:
            return []
        lay = self._layout
        joined = []
        for i, first in enumerate(self._rows[0]):
            if not isinstance(first, torch.Tensor):
                joined.append(first)
                continue
            parts = [row[i] for row in self._rows]
            out = assemble(
                parts,
                self._mode,
                self._period,
                lay.device_iterations,
                lay.gradient_accumulation,
                lay.replicas,
                self._empty,
            )
            joined.append(block_backward(demote(out.detach())))
        return joined
