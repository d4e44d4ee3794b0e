"""Automatic loss scaling (``Training.setAutomaticLossScaling(True)``): PopART's update rule.

The loss is multiplied by ``loss_scaling x factor``; ``factor`` (``lossScaleUpdateFactor`` in
the optimizer's ``ipu_state``, 1 at first) moves after each optimizer step, from the statistics
of the float16 gradients (still scaled) of that step:

    upper = elements with |g| >= binEdgeLocation x 65504   (float16's largest value; inf too)
    lower = every other element
    factor /= 2   if upper > f x lower, f = t / (1 - t), t = thresholdUpperCountProportion
    factor *= 2   otherwise

(defaults: ``binEdgeLocation`` 1/16, ``thresholdUpperCountProportion`` 1e-7). Float32 gradients
are not tracked; with none tracked, the factor stays where it is.

Simulated: PopART tracks the gradients of the ops' outputs, here the parameters' gradients are
tracked; the new factor applies from the next call of the model (with ``deviceIterations(1)``,
as in PopART, from the next step), so every step of one call uses one scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["AutomaticLossScaling", "FACTOR_NAME", "FINAL_NAME"]

FACTOR_NAME = "lossScaleUpdateFactor"  # its ipu_state key
FINAL_NAME = "finalLossScale"  # the anchor of the loss scale a step used
_FP16_MAX = float(torch.finfo(torch.float16).max)


class AutomaticLossScaling:
    """The update factor and the rule that moves it (see module doc)."""

    def __init__(self, popart_options: Mapping[str, Any]) -> None:
        self.bin_edge = float(
            popart_options.get("automaticLossScalingSettings.binEdgeLocation", 1 / 16)
        )
        threshold = float(
            popart_options.get("automaticLossScalingSettings.thresholdUpperCountProportion", 1e-7)
        )
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"thresholdUpperCountProportion must be in [0, 1], got {threshold}")
        self.ratio = threshold / (1.0 - threshold) if threshold < 1.0 else float("inf")
        self.factor = 1.0
        self._next: float | None = None

    def observe(self, grads: Sequence[torch.Tensor | None]) -> None:
        """Decide the next factor from one step's (scaled) gradients."""
        tracked = [g for g in grads if g is not None and g.dtype == torch.float16]
        if not tracked:
            return
        edge = self.bin_edge * _FP16_MAX
        upper = sum(int((g.abs() >= edge).sum()) for g in tracked)
        lower = sum(g.numel() for g in tracked) - upper
        scale_down = upper > self.ratio * lower
        self._next = self.factor / 2 if scale_down else self.factor * 2

    def finish_run(self) -> bool:
        """Apply the factor decided during the call; True if it changed."""
        if self._next is None or self._next == self.factor:
            self._next = None
            return False
        self.factor, self._next = self._next, None
        return True
