"""Program outputs computed straight into the caller's joined output.

[Note: outputs computed in place]
An inference call returns every micro-batch's outputs joined into one tensor per output
(``OutputMode.All``). Joined after the run, that is one more pass over every output byte: for a
language model, the logits (GPT-2's ten 4 × 128 × 50,257 float32 micro-batches are 1 GB, copied
in 127-177 ms on two cores into a reused buffer, 5-7% of the call; ``benchmarks/RESULTS.md``),
plus the page faults of each micro-batch's fresh logits. Eager PyTorch's loop pays the faults
but never joins. So where the caller has the joined buffer ready (from the second call on, when
each micro-batch's output shape is known), each micro-batch's rows of it go to the run as its
destination, and the graph node that makes a program output computes into them with the
operator's ``out=`` form (``aten.linear.out``, ``aten.cat.out`` ...): no copy and no fresh
pages. The caller then finds each part already in place and returns the buffer as it is.

Only what is the same computation is rewritten: a stage's output node whose value goes to the
host and to no other stage, made by an ATen operator with one tensor result and an ``out``
overload taking the same arguments, with a static shape (graphs captured by ``torch.export``),
or by an ``nn.Linear`` layer (graphs captured by torch.fx; ``aten.linear.out`` where the
operands share a dtype, else the layer itself). The rewritten graph is a copy that shares the
stage's parameters; the stage's own graph is left as it was. A run without destinations (the
first call, a training call, a CUDA stage, outputs the caller joins otherwise) computes exactly
as before, and so does a call whose destination does not match the output's shape and dtype.
The values are those of the same operator: ``out=`` runs the same kernel (tested bit for bit
against eager).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx

__all__ = ["destinations", "in_place_module", "linear_into", "write_into"]

_local = threading.local()
_LAYERS = ("torch.nn.modules.linear", "poptorch_sim.executor.precision")  # nn.Linear forwards


@contextmanager
def destinations(into: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Within the block, this thread's rewritten nodes write the outputs named in ``into``."""
    previous = getattr(_local, "into", None)
    _local.into = into
    try:
        yield
    finally:
        _local.into = previous


def _destination(name: str, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor | None:
    """This thread's destination for ``name`` if it has ``shape`` and ``dtype`` and neither
    autograd nor autocast is on, else None."""
    into = getattr(_local, "into", None)
    out = into.get(name) if into else None
    if (
        out is None
        or out.shape != tuple(shape)
        or out.dtype != dtype
        or torch.is_grad_enabled()
        or torch.is_autocast_enabled("cpu")
    ):
        return None
    return out


def write_into(
    name: str,
    op: torch._ops.OpOverload,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """``op(*args, **kwargs)``, computed into this thread's destination for ``name`` when
    ``_destination`` gives one, else as usual."""
    out = _destination(name, shape, dtype)
    if out is None:
        return op(*args, **kwargs)
    return op.overloadpacket.out(*args, **kwargs, out=out)  # type: ignore[no-any-return]


def _out_form(op: object) -> bool:
    """Whether ``op`` is an ATen operator with one tensor result whose ``out`` overload takes
    the same arguments plus ``out``."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    schema = op._schema
    out = getattr(op.overloadpacket, "out", None)
    if out is None or len(schema.returns) != 1 or str(schema.returns[0].type) != "Tensor":
        return False
    if schema.is_mutable or any(a.alias_info is not None for a in schema.arguments):
        return False
    same = [(a.name, str(a.type)) for a in out._schema.arguments if not a.is_out]
    return (
        same == [(a.name, str(a.type)) for a in schema.arguments]
        and sum(a.is_out for a in out._schema.arguments) == 1
    )


def _linear(module: fx.GraphModule, graph: fx.Graph, node: fx.Node, name: str) -> bool:
    """Makes a torch.fx graph's call of an ``nn.Linear`` layer (one whose forward is the plain
    one, or poptorch_sim's that casts mixed operands) that makes ``name`` call ``linear_into``
    instead, and says so; other nodes are left alone."""
    if node.op != "call_module" or node.kwargs or len(node.args) != 1:
        return False
    layer = module.get_submodule(str(node.target))
    forward = getattr(type(layer), "forward", None)
    plain = isinstance(layer, torch.nn.Linear) and getattr(forward, "__module__", "") in _LAYERS
    if not plain or layer._forward_hooks or layer._forward_pre_hooks:
        return False
    with graph.inserting_before(node):
        held = graph.get_attr(str(node.target))
    node.op, node.target, node.args = "call_function", linear_into, (name, held, node.args[0])
    return True


def linear_into(name: str, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)``, computed into this thread's destination for ``name`` when the operands
    share a dtype and ``_destination`` gives one for the result, else as usual."""
    same = layer.weight.dtype == x.dtype and (layer.bias is None or layer.bias.dtype == x.dtype)
    out = _destination(name, (*x.shape[:-1], layer.out_features), x.dtype) if same else None
    if out is None:
        return layer(x)  # type: ignore[no-any-return]
    return torch.ops.aten.linear.out(x, layer.weight, layer.bias, out=out)  # type: ignore[no-any-return]


def in_place_module(
    module: object, outputs: Sequence[str], names: set[str]
) -> fx.GraphModule | None:
    """A copy of ``module``'s graph (sharing its parameters) whose nodes making the outputs in
    ``names`` call ``write_into`` or ``linear_into``, or None when none qualifies (See [Note: outputs computed in
    place]).

    Args:
        module: a stage's module; only an ``fx.GraphModule`` returning a tuple qualifies.
        outputs: the stage's output names, in the order of the returned tuple.
        names: the outputs that go to the host only.
    """
    if not isinstance(module, fx.GraphModule) or not names:
        return None
    graph = fx.Graph()
    returned = graph.graph_copy(module.graph, {})
    if not isinstance(returned, (tuple, list)) or len(returned) != len(outputs):
        return None
    graph.output(returned)
    written = 0
    for name, node in zip(outputs, returned):
        if name not in names or not isinstance(node, fx.Node):
            continue
        if _linear(module, graph, node, name):
            written += 1
            continue
        value = node.meta.get("val")
        if node.op != "call_function":
            continue
        if not _out_form(node.target) or not isinstance(value, torch.Tensor):
            continue
        if not all(isinstance(d, int) for d in value.shape):
            continue  # a symbolic shape: not known before the run
        node.args = (name, node.target, tuple(value.shape), value.dtype, *node.args)
        node.target = write_into
        written += 1
    if not written:
        return None
    return fx.GraphModule(module, graph, class_name=f"{type(module).__name__}InPlace")
