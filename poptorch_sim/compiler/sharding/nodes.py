"""``list_nodes``: the names a user can pick split points from, with op, shape and source line."""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, TextIO

import torch
import torch.fx as fx
from torch import nn
from torch.fx.node import _get_qualified_name
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from ..capture import capture_model
from ..signature import flatten_inputs
from ..tracer import Trace
from .algorithm import OP_KINDS

__all__ = ["NodeInfo", "list_nodes", "describe_nodes"]


class NodeInfo(NamedTuple):
    """One op of the captured graph."""

    name: str
    op: str
    shape: str
    location: str


def _op(node: fx.Node, trace: Trace) -> str:
    if node.op == "call_module":
        return type(trace.resolve(str(node.target))).__name__
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    try:
        name = _get_qualified_name(node.target)  # type: ignore[arg-type]
        return name.replace("_operator.", "operator.").replace("torch.ops.aten.", "aten.")
    except (AttributeError, RuntimeError, TypeError):
        return str(node.target)


def _shape(value: Any) -> str:
    if isinstance(value, TensorMetadata):
        return "x".join(str(d) for d in value.shape) or "scalar"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_shape(v) for v in value) + ")"
    return "-" if value is None else type(value).__name__


def _propagate_shapes(trace: Trace, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Run the graph once on the example inputs, recording ``node.meta["tensor_meta"]``."""
    module = trace.graph_module()
    inputs = flatten_inputs(trace.signature, args, kwargs)
    with torch.no_grad():
        ShapeProp(module).propagate(*inputs)


def describe_nodes(trace: Trace) -> list[NodeInfo]:
    """One ``NodeInfo`` per op of ``trace``, in graph order (shapes if propagated)."""
    return [
        NodeInfo(
            node.name,
            _op(node, trace),
            _shape(node.meta.get("tensor_meta")),
            str(node.meta.get("location", "<unknown location>")),
        )
        for node in trace.graph.nodes
        if node.op in OP_KINDS
    ]


def list_nodes(
    model: nn.Module,
    *example_inputs: Any,
    file: TextIO | None = None,
    capture_method: str = "auto",
    **example_kwargs: Any,
) -> list[NodeInfo]:
    """Print the unique node names of ``model``'s captured graph, to pick split points from.

    The names are the graph's own (fx graphs keep them unique, e.g. ``layer1_0_conv1``,
    ``add_13`` from torch.fx; ATen op names such as ``linear_3`` from torch.export); ``Sharder``
    and PopRT's YAML config refer to ops by these names.

    Args:
        model: the model (the same one that will be sharded).
        *example_inputs: one example call's positional arguments (run once to find shapes).
        file: where to print the table (default ``sys.stdout``).
        capture_method: "auto" (torch.fx, then torch.export), "fx" or "export"; as the model's
            ``opts.Jit.captureMethod`` (the front ends name nodes differently).
        **example_kwargs: the example call's keyword arguments.

    Returns:
        The ops, in graph (topological) order.

    Raises:
        poptorch_sim.compiler.TraceFailure: the model cannot be captured.

    >>> # poptorch_sim.list_nodes(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224))
    >>> # name            op                    shape        source
    >>> # conv1           module conv1          1x64x112x112 .../resnet.py:268 in _forward_impl
    """
    trace = capture_model(model, tuple(example_inputs), dict(example_kwargs), capture_method)
    _propagate_shapes(trace, tuple(example_inputs), dict(example_kwargs))
    infos = describe_nodes(trace)
    _print_table(infos, file if file is not None else sys.stdout)
    return infos


def _print_table(infos: list[NodeInfo], file: TextIO) -> None:
    header = NodeInfo("name", "op", "shape", "source")
    width = [max(len(getattr(i, f)) for i in [header, *infos]) for f in ("name", "op", "shape")]
    for info in [header, *infos]:
        print(
            f"{info.name:<{width[0]}}  {info.op:<{width[1]}}  {info.shape:<{width[2]}}  "
            f"{info.location}",
            file=file,
        )
