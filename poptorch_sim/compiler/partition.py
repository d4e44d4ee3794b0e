"""Assigning each traced op to a stage and an IPU, by the execution strategy and PopTorch's rules.

    ops before the first block         stage 0 (phase 0) on IPU 0
    ops inside / after a block start   the placement of that block entry (from the strategy)
    ops after a ``with Block`` ended   Error "No active Block, all the ops must belong to a Block"
    placeholders / get_attr            wherever they are used (not assigned here)

Ops are grouped by (stage or phase, IPU); groups run in order of stage (phase), then of their
first op. A value may skip stages but must never flow backwards. Consecutive groups on the same
IPU are merged, as PopTorch merges them ("every time the IPU changes there is a new stage").
Each op's ``node.meta`` gets ``block`` (id, None before the first block), ``stage`` and ``ipu``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.fx as fx

from ..errors import Error
from ..options.strategies import Placement, _IExecutionStrategy
from .tracer import Trace

__all__ = ["StagePlan", "Partition", "partition", "node_location", "NO_ACTIVE_BLOCK"]

NO_ACTIVE_BLOCK = "No active Block, all the ops must belong to a Block"
_BEFORE_FIRST_BLOCK = Placement(0, 0, 0)
OP_KINDS = ("call_function", "call_method", "call_module")


@dataclass
class StagePlan:
    """The ops of one stage, in graph order."""

    ipu: int
    nodes: list[fx.Node] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)


@dataclass
class Partition:
    """Stages in pipeline order and where each op and block entry went.

    Attributes:
        stages: the stages, in pipeline order.
        stage_of: op node → index into ``stages``.
        placements: strategy placement of each block entry (``Trace.entries`` order).
        entry_stage: stage index of each block entry (None when the entry holds no op).
        forward_stages: PopTorch's forward pipeline depth: IPU changes over the block entries
            in program order (starting from IPU 0), plus one.
    """

    stages: list[StagePlan]
    stage_of: dict[fx.Node, int]
    placements: list[Placement]
    entry_stage: list[int | None]
    forward_stages: int


def node_location(node: fx.Node) -> str:
    """``file:line in function: code`` of the user line that created ``node``."""
    return str(node.meta.get("location", "<unknown location>"))


def _placement(node: fx.Node, trace: Trace, placements: list[Placement]) -> Placement:
    if node.meta.get("after_exit"):
        entry = trace.entries[node.meta["block_entry"]]
        raise Error(
            f"{NO_ACTIVE_BLOCK}: op '{node.name}' runs after block '{entry.block_id}' ended "
            f"({node_location(node)}). Put it inside a poptorch.Block, or start a block with "
            "poptorch.Block.start()."
        )
    entry = node.meta.get("block_entry")
    return _BEFORE_FIRST_BLOCK if entry is None else placements[entry]


def _order(placement: Placement, phased: bool) -> int:
    return placement.phase if phased else placement.stage


_Key = tuple[int, int]  # (stage or phase, IPU)


def _group(
    trace: Trace, placements: list[Placement], phased: bool
) -> tuple[list[StagePlan], dict[_Key, int], dict[fx.Node, int]]:
    """Ops grouped by key, groups in pipeline order; the index of each key and op."""
    groups: dict[_Key, StagePlan] = {}
    first: dict[_Key, int] = {}
    key_of: dict[fx.Node, _Key] = {}
    for position, node in enumerate(trace.graph.nodes):
        if node.op not in OP_KINDS:
            continue
        placement = _placement(node, trace, placements)
        key = (_order(placement, phased), placement.ipu)
        if key not in groups:
            groups[key] = StagePlan(ipu=placement.ipu)
            first[key] = position
        groups[key].nodes.append(node)
        key_of[node] = key
    if not groups:  # a model without ops still has one (empty) stage
        groups[(0, 0)], first[(0, 0)] = StagePlan(ipu=0), 0
    order = sorted(groups, key=lambda k: (k[0], first[k]))
    index = {key: i for i, key in enumerate(order)}
    return [groups[k] for k in order], index, {n: index[k] for n, k in key_of.items()}


def _check_direction(plans: list[StagePlan], index_of: dict[fx.Node, int], trace: Trace) -> None:
    for i, plan in enumerate(plans):
        for node in plan.nodes:
            for arg in node.all_input_nodes:
                j = index_of.get(arg)
                if j is not None and j > i:
                    raise Error(
                        f"op '{node.name}' (stage {i} on IPU {plan.ipu}) uses '{arg.name}', which "
                        f"is computed later in the pipeline (stage {j} on IPU {plans[j].ipu}) "
                        f"at {node_location(node)}. Stages must be ordered so that values only "
                        "flow forward: with blocks that return to an earlier IPU use "
                        "poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement), or list "
                        "the stages in execution order."
                    )


def _merge_same_ipu(plans: list[StagePlan]) -> tuple[list[StagePlan], list[int]]:
    merged: list[StagePlan] = []
    new_index: list[int] = []
    for plan in plans:
        if merged and merged[-1].ipu == plan.ipu:
            merged[-1].nodes.extend(plan.nodes)
        else:
            merged.append(StagePlan(ipu=plan.ipu, nodes=list(plan.nodes)))
        new_index.append(len(merged) - 1)
    return merged, new_index


def _forward_stages(placements: list[Placement]) -> int:
    switches, last = 0, 0
    for placement in placements:
        switches += placement.ipu != last
        last = placement.ipu
    return switches + 1


def _stamp(trace: Trace, stages: list[StagePlan], stage_of: dict[fx.Node, int]) -> None:
    """Record each op's block, stage and IPU in ``node.meta`` (for messages and tools)."""
    for node, index in stage_of.items():
        entry = node.meta.get("block_entry")
        node.meta["block"] = None if entry is None else trace.entries[entry].block_id
        node.meta["stage"] = index
        node.meta["ipu"] = stages[index].ipu


def partition(trace: Trace, strategy: _IExecutionStrategy) -> Partition:
    """Assign every op of ``trace`` to a stage.

    Raises:
        poptorch.Error: an op outside any block after a ``with Block`` ended, or a value that
            would flow from a later stage back to an earlier one.
        AssertionError: a block the strategy does not know, or ``AutoStage.SameAsIpu`` with a
            block that has no ``ipu_id`` (PopTorch's types and wording).
    """
    placer = strategy.placer()
    placements = [placer.place(e.block_id, e.ipu_id) for e in trace.entries]
    phased = strategy.mode == "phased"
    plans, index_of_key, index_of = _group(trace, placements, phased)
    _check_direction(plans, index_of, trace)
    stages, new_index = _merge_same_ipu(plans)
    stage_of = {node: new_index[i] for node, i in index_of.items()}
    _stamp(trace, stages, stage_of)
    entry_stage: list[int | None] = []
    for entry, placement in zip(trace.entries, placements):
        key = (_order(placement, phased), placement.ipu)
        stage = new_index[index_of_key[key]] if key in index_of_key else None
        entry_stage.append(stage)
        if stage is not None and entry.block_id not in stages[stage].blocks:
            stages[stage].blocks.append(entry.block_id)
    return Partition(stages, stage_of, placements, entry_stage, _forward_stages(placements))
