"""Assigning each traced op to a stage and an IPU, by the execution strategy and PopTorch's rules.

    ops before the first block         stage 0 (phase 0) on IPU 0
    ops inside / after a block start   the placement of that block entry (from the strategy)
    ops after a ``with Block`` ended   Error "No active Block, all the ops must belong to a Block"
    ``out[i]`` of a tuple-valued op    with the op that made the tuple (see ``_tuple_source``)
    placeholders / get_attr            wherever they are used (not assigned here)

Ops are grouped by (stage or phase, IPU); groups run in order of stage (phase), then of their
first op. Within a phase, the IPUs exchange values both ways, so a phase's ops are cut into a new
group each time the IPU changes in program order (phased execution runs as ordered shards). A
sharded program is one such phase: see [Note: a sharded program runs in program order]. A
value may skip stages but must never flow backwards. Consecutive groups on the same IPU are
merged, as PopTorch merges them ("every time the IPU changes there is a new stage").

[Note: a sharded program runs in program order]
PopTorch: "Note that stage_id must have ascending values in PipelinedExecution"; blocks on IPUs
0, 1, 0 under ``AutoStage.SameAsIpu`` give stage ids 0, 1, 0, and a pipeline cannot run the
third block in stage 0 when it reads what stage 1 computed. A sharded program has no pipeline:
"each shard is executed sequentially on a single IPU ... only one IPU is used at a time", and
"PopART will merge consecutive stages into one on the same IPU". So a sharded program's ops are
grouped in program order, a new group each time the IPU changes, whatever the stage ids: IPUs 0,
1, 0 are three stages (a tied LM head back on IPU 0, as optimum-graphcore places GPT-2's).
Each op's ``node.meta`` gets ``block`` (id, None before the first block), ``stage`` and ``ipu``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch.fx as fx
from torch import nn

from ..errors import Error
from ..options.strategies import Placement, _IExecutionStrategy
from .tracer import Trace

__all__ = ["StagePlan", "Partition", "partition", "node_location", "NO_ACTIVE_BLOCK"]

NO_ACTIVE_BLOCK = "No active Block, all the ops must belong to a Block"
_BEFORE_FIRST_BLOCK = Placement(0, 0, 0)
OP_KINDS = ("call_function", "call_method", "call_module")

# Ops that return a tuple of tensors. Taking ``out[i]`` of one is Python indexing, not an op, in
# PopTorch (which traces tensors): it belongs with the op, even after its block has ended.
_TUPLE_OPS = frozenset(
    {"split", "split_with_sizes", "tensor_split", "chunk", "unbind", "hsplit", "vsplit",
     "dsplit", "topk", "sort", "kthvalue", "mode", "aminmax", "std_mean", "var_mean", "frexp",
     "meshgrid", "broadcast_tensors", "unique_consecutive"}
)  # fmt: skip
_TUPLE_WITH_DIM = frozenset({"max", "min", "median", "nanmedian"})  # a tuple only with ``dim``
_TUPLE_MODULES = (nn.RNNBase, nn.MultiheadAttention)


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


def _order(placement: Placement, mode: str) -> int:
    if mode == "phased":
        return placement.phase
    if mode == "sharded":  # See [Note: a sharded program runs in program order]
        return 0
    return placement.stage


def _returns_tuple(node: fx.Node, trace: Trace) -> bool:
    if node.op == "call_module":
        return isinstance(trace.resolve(str(node.target)), _TUPLE_MODULES)
    if node.op == "call_function" and node.target is operator.getitem:
        # ``lstm(x)[1]`` is the tuple (h, c)
        source = node.args[0]
        return (
            isinstance(source, fx.Node)
            and source.op == "call_module"
            and isinstance(trace.resolve(str(source.target)), nn.LSTM)
            and node.args[1] == 1
        )
    if node.op not in ("call_function", "call_method"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if name in _TUPLE_WITH_DIM:
        return isinstance(
            node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None), int
        )
    return name in _TUPLE_OPS


def _tuple_source(node: fx.Node, trace: Trace) -> fx.Node | None:
    """The op whose tuple result ``node`` indexes (``out[i]``), if that is what ``node`` is."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    source, index = node.args[0], node.args[1]
    if isinstance(source, fx.Node) and isinstance(index, int) and _returns_tuple(source, trace):
        return source
    return None


_Key = tuple[int, int, int]  # (stage or phase, IPU, run of that IPU within a phase)


def _keys(trace: Trace, placements: list[Placement], mode: str) -> dict[fx.Node, _Key]:
    """The group key of every op, in graph order."""
    key_of: dict[fx.Node, _Key] = {}
    last_ipu: dict[int, int] = {}  # phase -> IPU of its latest op
    runs: dict[int, int] = {}  # phase -> IPU changes so far within it
    for node in trace.graph.nodes:
        if node.op not in OP_KINDS:
            continue
        source = _tuple_source(node, trace)
        if source is not None and source in key_of:
            key_of[node] = key_of[source]
            continue
        placement = _placement(node, trace, placements)
        order = _order(placement, mode)
        if mode != "pipelined" and last_ipu.get(order, placement.ipu) != placement.ipu:
            runs[order] = runs.get(order, 0) + 1
        last_ipu[order] = placement.ipu
        key_of[node] = (order, placement.ipu, runs.get(order, 0))
    return key_of


def _group(
    trace: Trace, placements: list[Placement], mode: str
) -> tuple[list[StagePlan], dict[fx.Node, int]]:
    """Ops grouped by key, groups in pipeline order; the index of each op's group."""
    groups: dict[_Key, StagePlan] = {}
    first: dict[_Key, int] = {}
    key_of = _keys(trace, placements, mode)
    for position, (node, key) in enumerate(key_of.items()):
        if key not in groups:
            groups[key] = StagePlan(ipu=key[1])
            first[key] = position
        groups[key].nodes.append(node)
    if not groups:  # a model without ops still has one (empty) stage
        groups[(0, 0, 0)], first[(0, 0, 0)] = StagePlan(ipu=0), 0
    order = sorted(groups, key=lambda k: (k[0], first[k]))
    index = {key: i for i, key in enumerate(order)}
    return [groups[k] for k in order], {n: index[k] for n, k in key_of.items()}


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


def _entry_stages(
    trace: Trace, stages: list[StagePlan], stage_of: dict[fx.Node, int]
) -> list[int | None]:
    """The stage of each block entry's ops (None if it has none); names blocks on stages."""
    entry_stage: list[int | None] = [None] * len(trace.entries)
    for node, stage in stage_of.items():
        entry = node.meta.get("block_entry")
        if entry is None or node.meta.get("after_exit") or _tuple_source(node, trace):
            continue
        if entry_stage[entry] is None:
            entry_stage[entry] = stage
            if trace.entries[entry].block_id not in stages[stage].blocks:
                stages[stage].blocks.append(trace.entries[entry].block_id)
    return entry_stage


def partition(trace: Trace, strategy: _IExecutionStrategy) -> Partition:
    """Assign every op of ``trace`` to a stage.

    Raises:
        poptorch.Error: an op outside any block after a ``with Block`` ended, or a value that
            would flow from a later pipeline stage back to an earlier one.
        AssertionError: a block the strategy does not know, or ``AutoStage.SameAsIpu`` with a
            block that has no ``ipu_id`` (PopTorch's types and wording).
    """
    placer = strategy.placer()
    placements = [placer.place(e.block_id, e.ipu_id) for e in trace.entries]
    plans, index_of = _group(trace, placements, strategy.mode)
    _check_direction(plans, index_of, trace)
    stages, new_index = _merge_same_ipu(plans)
    stage_of = {node: new_index[i] for node, i in index_of.items()}
    _stamp(trace, stages, stage_of)
    entry_stage = _entry_stages(trace, stages, stage_of)
    return Partition(stages, stage_of, placements, entry_stage, _forward_stages(placements))
