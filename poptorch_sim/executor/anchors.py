"""Anchored tensors (``Options.anchorTensor``): each optimizer step's value, joined per output mode.

[Note: anchored tensors follow their output mode]
PopTorch streams an anchored tensor to the host as it streams a model output: the buffer of an
anchor is allocated with dim 0 multiplied by the anchor's batch dimension (PopTorch's
``PoplarExecutable::run``, ``dims[0] *= popartBatchDimForAnchor(id)``; a 0-d tensor counts as
``[1]``), and ``getAnchoredTensor`` returns that buffer. An anchor without an output mode takes
the model's (``Options.outputMode``) when the model is wrapped. The values anchored here
(``Gradient___<param>``, ``UpdatedVar___<param>``, ``finalLossScale``, and a weight or buffer
of the model by its own name, e.g. a BatchNorm's ``running_mean``) are made once per optimizer
step (inference: once per device iteration, the model's tensors as the call leaves them), so
one call of ``deviceIterations(DI)`` has DI of them, joined as outputs are:

    mode        returned (a value of shape S per device iteration)
    All         the DI values joined on dim 0: S[0]·DI (0-d: [DI]); a bias of 10, DI 3: (30,)
    EveryN(P)   the values of device iterations P-1, 2P-1, ...: S[0]·DI/P
    Final       the last value: S
    Sum         the elementwise sum of the DI values: S

Simulated: on an IPU the All and EveryN buffers also have a row per accumulation step and per
replica (``DI·GA·R``); the simulator keeps the one value each optimizer step makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..enums import OutputMode
from ..errors import Error
from .streams import assemble

__all__ = ["Anchor", "AnchorCollector", "anchors_of"]


@dataclass(frozen=True)
class Anchor:
    """One ``anchorTensor`` call, its output mode resolved."""

    short_name: str
    long_name: str
    mode: OutputMode
    period: int


def anchors_of(options: Any) -> list[Anchor]:
    """The anchors of ``options``; those without an output mode take the model's.

    Args:
        options: the model's (frozen) ``poptorch.Options``.

    >>> import poptorch_sim as poptorch
    >>> opts = poptorch.Options().outputMode(poptorch.OutputMode.All)
    >>> opts.anchorTensor("g", "Gradient___fc.bias")
    >>> anchors_of(opts)[0].mode.name
    'All'
    """
    anchors = []
    for short_name, (long_name, use_default, mode, period) in options.anchored_tensors.items():
        if use_default:
            mode, period = options.output_mode, options.output_return_period
        mode = OutputMode(mode)
        anchors.append(
            Anchor(short_name, long_name, mode, period if mode == OutputMode.EveryN else 1)
        )
    return anchors


class AnchorCollector:
    """Takes the anchored values after each optimizer step of a call, then joins them.

    See [Note: anchored tensors follow their output mode].

    Args:
        anchors: the model's anchors.
        device_iterations: optimizer steps per call.

    Raises:
        Error: an EveryN period that is not a factor of ``device_iterations``.
    """

    def __init__(self, anchors: list[Anchor], device_iterations: int) -> None:
        for anchor in anchors:
            period = anchor.period
            if anchor.mode == OutputMode.EveryN and (
                period > device_iterations or device_iterations % period != 0
            ):
                raise Error(
                    f"Return period must be a factor of the number of batches per step and <= "
                    f"to it: anchor '{anchor.short_name}' has output_return_period={period}, "
                    f"deviceIterations={device_iterations}"
                )
        self._anchors = anchors
        self._steps: list[dict[str, torch.Tensor]] = []

    @property
    def long_names(self) -> set[str]:
        """The anchored tensors' names."""
        return {anchor.long_name for anchor in self._anchors}

    def take(
        self, values: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Keep one step's values: ``values`` (made by the step) and a host copy of each of
        the model's ``tensors`` (weights and buffers, by name) as they are now."""
        kept = dict(values)
        for name, tensor in (tensors or {}).items():
            kept[name] = tensor.detach().to("cpu", copy=True)
        self._steps.append(kept)

    def stepping(
        self,
        step: Callable[[], None],
        values: dict[str, torch.Tensor],
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> Callable[[], None]:
        """``step``, then ``take(values, tensors)``: the latest value of each anchored name."""

        def step_and_take() -> None:
            step()
            self.take(values, tensors)

        return step_and_take

    def result(self) -> dict[str, torch.Tensor]:
        """Each anchor's joined value by short name (anchors never given a value are left out)."""
        joined = {}
        for anchor in self._anchors:
            parts = [step[anchor.long_name] for step in self._steps if anchor.long_name in step]
            if len(parts) != len(self._steps) or not parts:
                parts = parts[-1:]  # a value made in some steps only: the latest
            if not parts:
                continue
            joined[anchor.short_name] = assemble(
                parts, anchor.mode.name, min(anchor.period, len(parts)), len(parts), 1, 1
            )
        return joined
