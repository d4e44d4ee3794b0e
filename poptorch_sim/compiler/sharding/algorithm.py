"""PopRT's manual sharding rule on a captured graph: every op gets a device and a stage.

[Note: PopRT's sharding rule]
PopRT (user guide §5.10.3) assigns the ancestors of each split point, not the ops after it:

    1. sort the split points topologically (fx keeps ``graph.nodes`` in that order);
    2. from each split point, in that order, walk towards the inputs; every op reached gets the
       split point's device and stage; a branch stops at an op that has no producer (only
       inputs, parameters or constants feed it) or that is already assigned;
    3. every op left over gets (largest device + 1, largest stage + 1).

So a split point ends its stage (the cut falls after it), earlier split points claim shared
ancestors first, and the leftovers (the descendants of the last split point, and side branches
no split point needs) form one more stage on one more device. In fx terms placeholders and
``get_attr`` nodes (PopRT's graph inputs and initializers) are not ops: each stage that uses a
parameter references it. Two fx-specific adjustments: ``out[i]`` of an op that returns a tuple
goes with that op (a tuple never crosses stages), and without ``pipelining_info`` the stage of a
split point is its rank in graph order.

    x ─ conv1 ─ relu ─ add ─ conv2 ─ add_1 ─ fc          split points: add → (0, 0),
         └────────────┘       └───────┘                                add_1 → (1, 1)
    device/stage: conv1, relu, add: (0, 0)   conv2, add_1: (1, 1)   fc: leftover (2, 2)
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import NamedTuple

import torch.fx as fx

from ... import env
from ..partition import _tuple_source
from ..tracer import Trace
from .config import ShardingConfig, ShardingError, SplitPoint

__all__ = ["Shard", "Assignment", "assign", "check_devices", "closest_names", "OP_KINDS"]

OP_KINDS = ("call_function", "call_method", "call_module")
_MAX_IPUS = 64


class Shard(NamedTuple):
    """Where one op runs: ``device`` (IPU), pipeline ``stage`` and the split point that claimed
    it (None: a leftover)."""

    device: int
    stage: int
    split: str | None


@dataclass
class Assignment:
    """The shard of every op of a graph.

    Attributes:
        shard_of: op node → its ``Shard``, in graph order.
        leftover: the leftovers' shard, or None when every op was claimed by a split point.
    """

    shard_of: dict[fx.Node, Shard]
    leftover: Shard | None

    def by_name(self) -> dict[str, tuple[int, int]]:
        """Node name → (device, stage): the per-node form PopRT writes into the graph."""
        return {node.name: (s.device, s.stage) for node, s in self.shard_of.items()}

    @property
    def num_devices(self) -> int:
        """Highest device used + 1."""
        return max((s.device for s in self.shard_of.values()), default=0) + 1

    def leftover_nodes(self) -> list[str]:
        """Names of the ops no split point claimed."""
        return [n.name for n, s in self.shard_of.items() if s.split is None]


def closest_names(name: str, names: list[str]) -> str:
    """The existing names closest to ``name`` (difflib), for "did you mean" messages."""
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    return ", ".join(close) if close else "none close; see poptorch_sim.list_nodes(model, ...)"


def _resolve(graph: fx.Graph, config: ShardingConfig) -> list[tuple[SplitPoint, fx.Node]]:
    """Each split point with its node, sorted topologically (PopRT's step 1)."""
    nodes = {node.name: node for node in graph.nodes}
    ops = [n.name for n in graph.nodes if n.op in OP_KINDS]
    resolved = []
    for point in config.points:
        node = nodes.get(point.node)
        if node is None:
            raise ShardingError(
                f"{config.source}: unknown node '{point.node}' (closest names: "
                f"{closest_names(point.node, ops)}). poptorch_sim.list_nodes(model, "
                "*example_inputs) prints every node name with its op, shape and source line."
            )
        if node.op not in OP_KINDS:
            kind = {"placeholder": "an input", "get_attr": "a parameter or constant"}
            raise ShardingError(
                f"{config.source}: node '{point.node}' is {kind.get(node.op, 'the output')} of "
                f"the graph, not an op; split points are ops (nearby ops: "
                f"{closest_names(point.node, ops)})."
            )
        resolved.append((point, node))
    position = {node: i for i, node in enumerate(graph.nodes)}
    return sorted(resolved, key=lambda pair: position[pair[1]])


def _check_stage_devices(config: ShardingConfig) -> None:
    """A pipeline stage runs on one IPU (PopART's rule for virtual graphs in a pipeline)."""
    device_of: dict[int, SplitPoint] = {}
    for point in config.points:
        if point.stage is None:
            continue
        first = device_of.setdefault(point.stage, point)
        if first.device != point.device:
            raise ShardingError(
                f"{config.source}: stage {point.stage} is given two devices: '{first.node}' on "
                f"device {first.device} and '{point.node}' on device {point.device}. A "
                "pipeline stage runs on one IPU: give these split points the same device, or "
                "different stages."
            )


def _walk(start: fx.Node, shard: Shard, shard_of: dict[fx.Node, Shard]) -> None:
    """PopRT's step 2 from one split point (iterative: graphs can be deep)."""
    pending = [start]
    while pending:
        node = pending.pop()
        if node in shard_of or node.op not in OP_KINDS:
            continue
        shard_of[node] = shard
        pending.extend(node.all_input_nodes)


def _check_direction(
    shard_of: dict[fx.Node, Shard], ordered: list[tuple[SplitPoint, int]], source: str
) -> None:
    for node, shard in shard_of.items():
        for arg in node.all_input_nodes:
            producer = shard_of.get(arg)
            if producer is not None and producer.stage > shard.stage:
                order = ", ".join(f"{p.node} (stage {stage})" for p, stage in ordered)
                raise ShardingError(
                    f"{source}: the stage order sends activations backwards: node "
                    f"'{node.name}' (claimed by split point '{shard.split}', stage "
                    f"{shard.stage}) uses '{arg.name}' (split point '{producer.split}', stage "
                    f"{producer.stage}). Stages must not decrease along the graph; the split "
                    f"points in graph order are: {order}. Give later split points equal or "
                    "higher stages."
                )


def assign(trace: Trace, config: ShardingConfig) -> Assignment:
    """Give every op of ``trace`` a device and a stage by PopRT's rule.

    See [Note: PopRT's sharding rule].

    Args:
        trace: the captured graph.
        config: the split points.

    Returns:
        The ``Assignment`` (every op node of the graph is in ``shard_of``).

    Raises:
        ShardingError: an unknown node (with the closest names), a split point that is not an op,
            a stage on two devices, or a stage order that sends activations backwards.
    """
    ordered = _resolve(trace.graph, config)
    if config.pipelined:
        _check_stage_devices(config)
    ranked = [
        (point, node, point.stage if point.stage is not None else rank)
        for rank, (point, node) in enumerate(ordered)
    ]
    shard_of: dict[fx.Node, Shard] = {}
    for point, node, stage in ranked:
        _walk(node, Shard(point.device, stage, point.node), shard_of)
    ops = [n for n in trace.graph.nodes if n.op in OP_KINDS]
    # PopRT's step 3; then ``out[i]`` of a tuple goes with the op that made the tuple.
    leftover = Shard(
        max(p.device for p, _, _ in ranked) + 1, max(s for _, _, s in ranked) + 1, None
    )
    result: dict[fx.Node, Shard] = {}
    for node in ops:
        owner = _tuple_source(node, trace) or node
        result[node] = result.get(owner) or shard_of.get(owner, leftover)
    _check_direction(result, [(p, s) for p, _, s in ranked], config.source)
    used = leftover if leftover in result.values() else None
    return Assignment(result, used)


def check_devices(assignment: Assignment, config: ShardingConfig, replicas: int = 1) -> int:
    """The IPUs the sharded model reserves, checked against the IPUs this machine simulates.

    Args:
        assignment: the per-op assignment.
        config: its split points (for the message).
        replicas: the replication factor (each replica needs its own IPUs).

    Returns:
        ``(highest device + 1) × replicas``.

    Raises:
        ShardingError: more IPUs than ``POPTORCH_SIM_NUM_IPUS`` (or 64) are needed.
    """
    needed = assignment.num_devices * replicas
    available = env.num_ipus() or _MAX_IPUS  # 0 simulates no hardware: PopTorch's IPU Model
    limit = min(available, _MAX_IPUS)
    if needed <= limit:
        return needed
    leftover = assignment.leftover
    extra = ""
    if leftover is not None:
        names = assignment.leftover_nodes()
        extra = (
            f"; device {leftover.device} holds the {len(names)} op(s) no split point claims "
            f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): put the last split "
            f"point on the graph's last op ('{names[-1]}') to keep them on its device"
        )
    replicated = f" × {replicas} replicas = {needed}" if replicas > 1 else ""
    raise ShardingError(
        f"{config.source}: the device count is over the reserved IPUs: the split points use "
        f"devices up to {assignment.num_devices - 1}, so {assignment.num_devices} IPUs"
        f"{replicated} are needed, but {limit} are reserved "
        f"(POPTORCH_SIM_NUM_IPUS={available}, at most {_MAX_IPUS}){extra}. Use fewer devices, "
        f"or set POPTORCH_SIM_NUM_IPUS={needed} or more."
    )
