"""Cutting the traced graph into one GraphModule per stage, with named values between them.

Each stage module takes the values it consumes (program inputs or earlier stages' outputs, in
the order they were defined in the traced graph) and returns a tuple of the values a later
stage, the program output or the loss needs. Parameters, buffers and sub-modules are the
model's own objects, referenced by every stage that uses them (``get_attr`` nodes are copied
into each such stage), never copied. A program output that no stage computes (an input or a
parameter returned as is) is passed through the last stage. Ops traced under
``torch.no_grad()`` run with gradients disabled in their stage too. A stage input that an op
of the stage writes into in place is cloned first (see ``_mutated_inputs``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..program import StageSpec
from .partition import Partition
from .tracer import Trace

__all__ = ["split", "OutputLayout", "output_layout"]


class OutputLayout:
    """How ``forward``'s return value is made of named values and constants.

    Attributes:
        spec: the pytree ``TreeSpec`` of the return value (all leaves).
        leaves: per leaf, the producing ``fx.Node`` or the constant itself.
    """

    def __init__(self, output: fx.Node, spec: pytree.TreeSpec | None = None) -> None:
        if spec is None:
            leaves, spec = pytree.tree_flatten(output.args[0])
        else:  # the output node holds the flat leaves (torch.export)
            leaves = list(output.args[0])
        self.spec = spec
        self.leaves: list[Any] = leaves

    @property
    def nodes(self) -> list[fx.Node]:
        """The node leaves, in order."""
        return [leaf for leaf in self.leaves if isinstance(leaf, fx.Node)]

    @property
    def constants(self) -> dict[int, Any]:
        """Leaf index → value, for the leaves that are constants."""
        return {i: leaf for i, leaf in enumerate(self.leaves) if not isinstance(leaf, fx.Node)}


def output_layout(trace: Trace) -> OutputLayout:
    """The ``OutputLayout`` of the traced ``forward``."""
    return OutputLayout(next(n for n in trace.graph.nodes if n.op == "output"), trace.out_spec)


def _stage_io(
    part: Partition, trace: Trace, required: list[fx.Node]
) -> tuple[list[list[fx.Node]], list[list[fx.Node]], list[list[fx.Node]]]:
    """Per stage: consumed values, produced values and passed-through values."""
    position = {node: i for i, node in enumerate(trace.graph.nodes)}
    last = len(part.stages) - 1
    inputs: list[set[fx.Node]] = [set() for _ in part.stages]
    outputs: list[set[fx.Node]] = [set() for _ in part.stages]
    passthrough: list[fx.Node] = []
    for i, plan in enumerate(part.stages):
        for node in plan.nodes:
            for arg in node.all_input_nodes:
                producer = part.stage_of.get(arg)
                if arg.op == "placeholder" or (producer is not None and producer != i):
                    inputs[i].add(arg)
                    if producer is not None:
                        outputs[producer].add(arg)
    for node in required:
        producer = part.stage_of.get(node)
        if producer is None:
            passthrough.append(node)
            if node.op == "placeholder":
                inputs[last].add(node)
            outputs[last].add(node)
        else:
            outputs[producer].add(node)
    ordered_in = [sorted(s, key=position.__getitem__) for s in inputs]
    ordered_out = [sorted(s, key=position.__getitem__) for s in outputs]
    return ordered_in, ordered_out, [passthrough if i == last else [] for i in range(last + 1)]


class _GradMode:
    """Re-creates ``torch.no_grad()`` regions of ``forward`` (fx does not record grad mode)."""

    def __init__(self, graph: fx.Graph) -> None:
        self._graph = graph
        self._saved: fx.Node | None = None
        self._enabled = True

    def switch(self, enabled: bool) -> None:
        if enabled == self._enabled:
            return
        if self._saved is None:
            self._saved = self._graph.call_function(torch.is_grad_enabled)
        self._graph.call_function(torch._C._set_grad_enabled, (enabled,))
        self._enabled = enabled

    def restore(self) -> None:
        if self._saved is not None:
            self._graph.call_function(torch._C._set_grad_enabled, (self._saved,))


def _mutates_first_argument(node: fx.Node, trace: Trace) -> bool:
    """Whether ``node`` writes into its first argument (``nn.ReLU(inplace=True)``, ``x.add_``)."""
    if node.op == "call_module":
        return getattr(trace.resolve(str(node.target)), "inplace", False) is True
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.endswith("__") and name != "requires_grad_"
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "").split(".")[0]  # aten: "relu_.default"
        return node.kwargs.get("inplace") is True or (
            name.endswith("_") and not name.endswith("__")
        )
    return False


def _mutated_inputs(trace: Trace, nodes: list[fx.Node], inputs: list[fx.Node]) -> set[fx.Node]:
    """The stage inputs an op of the stage writes into: the stage gets its own copy of those.

    A received value is the sending stage's tensor (detached, same storage), which that stage
    may still need for its backward, and a leaf that requires grad, which autograd forbids
    writing into. A cut just before ``nn.ReLU(inplace=True)`` (as in torchvision's ResNets)
    does exactly that.
    """
    wanted = set(inputs)
    return {
        node.args[0]
        for node in nodes
        if node.args and node.args[0] in wanted and _mutates_first_argument(node, trace)
    }  # type: ignore[misc]


def _build_stage(
    trace: Trace, nodes: list[fx.Node], inputs: list[fx.Node], outputs: list[fx.Node], name: str
) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    mutated = _mutated_inputs(trace, nodes, inputs)
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
        if node in mutated:
            env[node] = graph.call_method("clone", (env[node],))

    def local(node: fx.Node) -> fx.Node:
        if node not in env and node.op == "get_attr":
            env[node] = graph.node_copy(node)
        return env[node]

    grad = _GradMode(graph)
    for node in nodes:
        if node in env:
            continue
        for arg in node.all_input_nodes:
            local(arg)
        grad.switch(node.meta.get("grad_enabled", True))
        env[node] = graph.node_copy(node, local)
    grad.restore()
    graph.output(tuple(local(node) for node in outputs))
    graph.lint()
    return trace.graph_module(graph, name=name)


def split(part: Partition, trace: Trace, required: list[fx.Node]) -> list[StageSpec]:
    """One ``StageSpec`` per stage of ``part``.

    Args:
        part: the partition.
        trace: the trace it partitions.
        required: nodes the program must return (output leaves and the loss).
    """
    inputs, outputs, passthrough = _stage_io(part, trace, required)
    specs = []
    for i, plan in enumerate(part.stages):
        extra = [n for n in passthrough[i] if n.op == "get_attr"]
        module = _build_stage(trace, extra + plan.nodes, inputs[i], outputs[i], f"Stage{i}")
        specs.append(
            StageSpec(
                index=i,
                ipu=plan.ipu,
                module=module,
                inputs=tuple(n.name for n in inputs[i]),
                outputs=tuple(n.name for n in outputs[i]),
                blocks=tuple(plan.blocks),
            )
        )
    return specs
