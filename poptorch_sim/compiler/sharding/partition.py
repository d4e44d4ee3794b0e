"""The compiler's ``Partition`` of a manually sharded graph: one stage per (stage, device).

The ops of each PopRT stage form one pipeline stage on its device, in stage order; consecutive
stages on the same device are merged, as PopTorch merges consecutive blocks on one IPU ("every
time the IPU changes there is a new stage"). Block annotations play no part: a model is cut by
its blocks or by its split points, never both.
"""

from __future__ import annotations

import torch.fx as fx

from ..partition import Partition, StagePlan
from ..tracer import Trace
from .algorithm import Assignment
from .config import ShardingConfig, ShardingError

__all__ = ["shard_partition"]

LEFTOVER = "<leftover>"


def _check_no_blocks(trace: Trace, config: ShardingConfig) -> None:
    if trace.entries:
        first = trace.entries[0]
        raise ShardingError(
            f"{config.source}: the model has block annotations (block '{first.block_id}' at "
            f"{first.location}) and manual sharding; a model is cut by one or the other. Remove "
            "the blocks (poptorch.removeBlocks(model) for BeginBlock) or the sharding config."
        )


def shard_partition(trace: Trace, assignment: Assignment, config: ShardingConfig) -> Partition:
    """The ``Partition`` that runs each op where ``assignment`` puts it.

    Each op's ``node.meta`` gets ``stage`` and ``ipu`` (as block partitions stamp them),
    ``block`` None and ``split_point`` (the claiming split point, None for leftovers).

    Raises:
        ShardingError: the model also has block annotations.
    """
    _check_no_blocks(trace, config)
    by_stage: dict[int, StagePlan] = {}
    for node, shard in assignment.shard_of.items():
        plan = by_stage.setdefault(shard.stage, StagePlan(ipu=shard.device))
        plan.nodes.append(node)
        label = shard.split or LEFTOVER
        if label not in plan.blocks:
            plan.blocks.append(label)
    stages: list[StagePlan] = []
    for stage in sorted(by_stage):
        plan = by_stage[stage]
        if stages and stages[-1].ipu == plan.ipu:
            stages[-1].nodes.extend(plan.nodes)
            stages[-1].blocks.extend(plan.blocks)
        else:
            stages.append(plan)
    if not stages:
        stages.append(StagePlan(ipu=0))
    stage_of: dict[fx.Node, int] = {}
    for index, plan in enumerate(stages):
        for node in plan.nodes:
            stage_of[node] = index
            node.meta.update(block=None, stage=index, ipu=plan.ipu)
            node.meta["split_point"] = assignment.shard_of[node].split
    return Partition(stages, stage_of, [], [], len(stages))
