"""The mean-reduction strategy an optimizer's accumulation dtype asks of the model's options."""

from __future__ import annotations

from typing import Any

import torch

from ...enums import MeanReductionStrategy

__all__ = ["apply_mean_reduction_strategy", "RUNNING_NEEDS_RECOMPILE"]

RUNNING_NEEDS_RECOMPILE = (
    "Invalid optimizer: the new optimizer would require changing options.Training."
    "meanAccumulationAndReplicationReductionStrategy to poptorch.MeanReductionStrategy.Running "
    "but the executable is already compiled."
)


def apply_mean_reduction_strategy(
    optimizer: torch.optim.Optimizer, options: Any, compiled: bool
) -> None:
    """Switch ``options`` to ``MeanReductionStrategy.Running`` when ``optimizer`` needs it.

    PopTorch's rule: gradients accumulated in float16 (``accum_type=torch.float16``) are
    averaged as they arrive (Running), since a float16 sum of many micro-batches overflows;
    SGD's combined variant only supports Post, so it keeps whatever was set. Before
    compilation the option is changed (even on frozen options, which stay frozen); after
    compilation a strategy other than Running cannot be changed any more.

    Args:
        optimizer: the optimizer the model is (or will be) compiled with.
        options: the model's ``poptorch.Options``.
        compiled: whether the model is already compiled (``setOptimizer`` after a run).

    Raises:
        ValueError: ``compiled`` and the options' strategy is not Running although
            ``optimizer`` needs it (PopTorch's wording).

    >>> apply_mean_reduction_strategy(Adam(params, accum_type=torch.float16), opts, False)
    """
    if getattr(optimizer, "accum_type", None) != torch.float16:
        return
    if getattr(optimizer, "use_combined_accum", False):
        return
    running = MeanReductionStrategy.Running
    training = options.Training
    if training.meanAccumulationAndReplicationReductionStrategy == running:
        return
    if compiled:
        raise ValueError(RUNNING_NEEDS_RECOMPILE)
    was_frozen = options._is_frozen
    options._unfreeze()
    try:
        training.setMeanAccumulationAndReplicationReductionStrategy(running)
    finally:
        if was_frozen:
            options._freeze()
