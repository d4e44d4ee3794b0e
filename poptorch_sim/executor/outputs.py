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

import math
import time
from typing import Any

import torch

from ..enums import OutputMode
from ..errors import Error
from ..runtime.dtypes import host_dtype
from .host_buffers import MIN_BYTES, OutputBuffers
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
        self._reserved: dict[int, torch.Tensor] = {}  # output index -> its joined buffer
        self.times: list[float] = []  # when each micro-batch's outputs arrived (perf.py)

    def add(self, leaves: list[Any]) -> None:
        """Record the output leaves of the next micro-batch (call in [DI, GA, R] order)."""
        self._rows.append(leaves)
        self.times.append(time.perf_counter())

    def reserve(
        self, index: int, shape: torch.Size, dtype: torch.dtype, count: int
    ) -> list[torch.Tensor] | None:
        """The joined buffer of output ``index`` split into ``count`` micro-batches' rows of
        ``shape``, for a run to compute into (See [Note: outputs computed in place]); None
        unless this call joins every micro-batch's rows (``OutputMode.All``) into reused memory
        and the output is large enough for that to matter."""
        lay = self._layout
        every = lay.device_iterations * lay.gradient_accumulation * lay.replicas
        if self._mode != OutputMode.All.name or self._empty is None or count != every or count < 2:
            return None
        if not shape or shape[0] == 0 or math.prod(shape) * dtype.itemsize < MIN_BYTES // count:
            return None
        joined = self._empty((count * shape[0], *shape[1:]), dtype)
        self._reserved[index] = joined
        return list(joined.split(shape[0]))

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
            reserved = self._reserved.pop(i, None)
            if reserved is not None and _filled(reserved, parts):
                joined.append(block_backward(demote(reserved)))
                continue
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


def _filled(joined: torch.Tensor, parts: list[Any]) -> bool:
    """Whether ``parts`` are ``joined``'s consecutive rows, in order (computed in place)."""
    rows = joined.shape[0] // len(parts)
    step = rows * (joined.nbytes // joined.shape[0])
    return all(
        isinstance(part, torch.Tensor)
        and part.is_contiguous()
        and part.shape == (rows, *joined.shape[1:])
        and part.dtype == joined.dtype
        and part.data_ptr() == joined.data_ptr() + m * step
        for m, part in enumerate(parts)
    )
