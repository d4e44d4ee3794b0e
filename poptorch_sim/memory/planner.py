"""Suggests where the ``BeginBlock``s go: stages balanced by cost, each IPU under its limit.

``candidates.py`` profiles the candidate modules in one forward of one micro-batch (by default
the items of the model's largest ``nn.ModuleList``: transformer layers, ResNet stages), each
costed by its measured forward time, or, for a model built on the ``meta`` device (nothing
allocated, e.g. BERT-base-sized configs), by its FLOPs. What runs before the first candidate
(embeddings) joins the first stage, what runs after the last (the head) the last stage.
``placement.py`` then cuts the candidates into ``num_ipus`` contiguous stages, one per IPU,
minimising the slowest stage's cost subject to every IPU's estimate ([Note: what each IPU
holds], with the micro-batches in flight of the runtime's 1F1B schedule) fitting its limit.
``timing.plan_time`` cuts the same candidates by predicted IPU time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from .candidates import planner_request, profile_candidates
from .placement import Plan, place

__all__ = ["Plan", "plan"]


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
    names, args, kwargs = planner_request("plan", model, inputs, num_ipus, candidates)
    profiled = profile_candidates(model, args, kwargs, names)
    unit = "FLOPs" if any(p.is_meta for p in model.parameters()) else "forward time"
    return place(profiled, num_ipus, options, optimizer, unit)
