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

An EveryN period PopART would refuse for the model's device iterations (not a factor of DI,
or larger) is not refused: that anchor is returned as the model's outputs are, with a warning.
PopTorch never refuses one: its lowering logs each anchor's own mode (``anchor ( <name>
EVERYN/4 )``, ``LowerToPopart.cpp``) but hands the anchor to PopART with the model's output mode
(``Compiler::addOutputTensor(id)``, whose mode defaults to the model's), so PopTorch's
``debug_tensors_test::test_tensor_modes`` anchors ``EveryN(4)`` in a model of one device
iteration and runs.

Simulated: on an IPU the All and EveryN buffers also have a row per accumulation step and per
replica (``DI·GA·R``); the simulator keeps the one value each optimizer step makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..enums import OutputMode
from ..logger import logger
from .streams import assemble

__all__ = ["Anchor", "AnchorCollector", "anchors_of", "log_anchors"]

# PopTorch's names of the output modes in its lowering log (``outputModeToString``).
_LOG_NAMES = {
    OutputMode.Final: "FINAL",
    OutputMode.EveryN: "EVERYN",
    OutputMode.All: "ALL",
    OutputMode.Sum: "Sum",
}


@dataclass(frozen=True)
class Anchor:
    """One ``anchorTensor`` call, its output mode resolved."""

    short_name: str
    long_name: str
    mode: OutputMode
    period: int


def _declared(options: Any) -> list[Anchor]:
    """The anchors of ``options`` with the mode each was given; those without one take the
    model's (as PopTorch's executor does when the model is wrapped)."""
    anchors = []
    for short_name, (long_name, use_default, mode, period) in options.anchored_tensors.items():
        if use_default:
            mode, period = options.output_mode, options.output_return_period
        mode = OutputMode(mode)
        anchors.append(
            Anchor(short_name, long_name, mode, period if mode == OutputMode.EveryN else 1)
        )
    return anchors


def _fits(anchor: Anchor, device_iterations: int) -> bool:
    """Whether PopART would take ``anchor``'s return period for ``device_iterations``."""
    period = anchor.period
    return anchor.mode != OutputMode.EveryN or (
        period <= device_iterations and device_iterations % period == 0
    )


def anchors_of(options: Any, device_iterations: int) -> list[Anchor]:
    """The anchors of ``options`` as a call of ``device_iterations`` returns them: those without
    an output mode, or with an EveryN period that does not fit the device iterations, take the
    model's (See [Note: anchored tensors follow their output mode]).

    Args:
        options: the model's (frozen) ``poptorch.Options``.
        device_iterations: optimizer steps per call.

    >>> import poptorch_sim as poptorch
    >>> opts = poptorch.Options().outputMode(poptorch.OutputMode.All)
    >>> opts.anchorTensor("g", "Gradient___fc.bias")
    >>> opts.anchorTensor("h", "Gradient___fc.weight", poptorch.OutputMode.EveryN, 4)
    >>> [a.mode.name for a in anchors_of(opts, 1)]
    ['All', 'All']
    """
    model_mode = OutputMode(options.output_mode)
    model_period = options.output_return_period if model_mode == OutputMode.EveryN else 1
    return [
        a if _fits(a, device_iterations) else replace(a, mode=model_mode, period=model_period)
        for a in _declared(options)
    ]


def log_anchors(options: Any, device_iterations: int) -> None:
    """At compile: PopTorch's debug line for each anchor (``  anchor ( <name> ALL/1 )``), and a
    warning for each whose EveryN period does not fit ``device_iterations``."""
    model_mode = OutputMode(options.output_mode)
    for anchor in _declared(options):
        name, mode = anchor.long_name, _LOG_NAMES[anchor.mode]
        logger.debug("  anchor ( %s %s/%d )", name, mode, anchor.period)
        if not _fits(anchor, device_iterations):
            logger.warning(
                "Anchor '%s': output_return_period=%d is not a factor of deviceIterations=%d, "
                "so it is returned as the model's outputs are "
                "(OutputMode.%s). Give anchorTensor a period that divides the device "
                "iterations to get every N-th value.",
                anchor.short_name,
                anchor.period,
                device_iterations,
                model_mode.name,
            )


class AnchorCollector:
    """Takes the anchored values after each optimizer step of a call, then joins them.

    See [Note: anchored tensors follow their output mode].

    Args:
        anchors: the model's anchors, as ``anchors_of`` resolves them for the call.
    """

    def __init__(self, anchors: list[Anchor]) -> None:
        self._anchors = anchors
        self._steps: list[dict[str, torch.Tensor]] = []

    @property
    def long_names(self) -> set[str]:
        """The anchored tensors' names."""
        return {anchor.long_name for anchor in self._anchors}

    def take(
        self,
        values: dict[str, torch.Tensor],
        tensors: dict[str, torch.Tensor] | None = None,
        steps: int = 1,
    ) -> None:
        """Keep ``steps`` steps' values, all the same: ``values`` (made by the step) and a host
        copy of each of the model's ``tensors`` (weights and buffers, by name) as they are now
        (copied once, however many steps)."""
        kept = dict(values)
        for name, tensor in (tensors or {}).items():
            kept[name] = tensor.detach().to("cpu", copy=True)
        self._steps.extend([kept] * steps)

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
