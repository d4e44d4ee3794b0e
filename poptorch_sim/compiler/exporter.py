"""Capturing ``forward`` with ``torch.export`` (non-strict), for models torch.fx cannot trace.

[Note: capture by torch.export]
torch.fx runs ``forward`` on proxies, so any Python decision on a shape, a size or a library
check (Hugging Face models slice with sizes, test masks, build caches) stops it. Non-strict
``torch.export`` runs ``forward`` as ordinary Python on fake tensors with static shapes, so all of
that just executes, and records the ATen ops (pre-dispatch, not decomposed further, in-place
ops kept) in program order. Because Python really runs, block annotations run too: the same
``_Recorder`` as the fx front end receives ``BeginBlock`` hooks (module pre-hooks fire) and
``with poptorch.Block`` entries and exits, and every graph node is stamped with the recorder's
state at the moment it is created (``fx.Graph.create_node`` is wrapped while ``forward`` runs on
the capturing thread). The exported graph is then rewritten into the ``Trace`` contract:

    exported program                       Trace
    p_* / b_* placeholders (lifted)        get_attr of the model's own parameter / buffer
    c_* placeholders, get_attr constants   get_attr into ``Trace.constants``
    user inputs (flat tensors)             placeholders named as ``flatten_inputs`` names them
    wrap_with_set_grad_enabled(...)        its body inlined, ``grad_enabled`` stamped per node
    output (flat leaves)                   the same leaves, ``Trace.out_spec`` rebuilds them

Losses are found by the same catalogue as the fx front end: a ``TorchFunctionMode`` sees the
torch loss functions (loss modules call them) and ``identity_loss`` reports its result; the
node each one produced last gets ``meta["loss"]``. Values that depend on tensor *contents*
(``if x.sum() > 0``) cannot be exported either: the error names the user's line.
"""

from __future__ import annotations

import inspect
import io
import logging
import operator
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import config as fx_config
from torch.overrides import TorchFunctionMode

from ..ipu_context import running_on_ipu
from ..ops import loss as loss_ops
from ..ops.blocks import recording_blocks
from ..ops.library import CAPTURE_ONLY
from .containers import flat_outputs
from .signature import map_tensor_inputs
from .tracer import (
    _CONSTANT_PREFIX,
    _TRACE_LOCK,
    Trace,
    TraceFailure,
    _is_tracing_failure,
    _module_state_restored,
    _Recorder,
    _user_frame,
    _user_location,
)

__all__ = ["export_model"]

_GRAD_HOP = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
_ASSERT_METADATA = getattr(torch.ops.aten, "_assert_tensor_metadata", None)
_ASSERT_METADATA = getattr(_ASSERT_METADATA, "default", None)
_STAMPS = ("block_entry", "after_exit", "location", "stack_trace", "grad_enabled")
_ROOT = "model"  # the attribute under which ``_FlatInputs`` holds the user's model


class _Stamper:
    """Stamps the nodes created on the capturing thread with the recorder's block state."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder
        self.thread = threading.get_ident()
        self.active = False  # True only while ``forward`` runs
        self.last: fx.Node | None = None

    def stamp(self, node: fx.Node) -> None:
        if not self.active or threading.get_ident() != self.thread:
            return
        node.meta["block_entry"] = self.recorder.current
        node.meta["after_exit"] = self.recorder.after_exit
        if node.op not in ("placeholder", "output"):
            node.meta["location"], node.meta["stack_trace"] = _user_frame()
            node.meta["grad_enabled"] = torch.is_grad_enabled()
            self.last = node

    def mark_loss(self, _result: Any = None) -> None:
        """The node made last is a loss's result (called right after a loss returns)."""
        if self.active and self.last is not None and threading.get_ident() == self.thread:
            self.last.meta["loss"] = True


class _LossFunctions(TorchFunctionMode):
    """Marks the result of every torch loss function called while ``forward`` is captured."""

    def __init__(self, stamper: _Stamper) -> None:
        super().__init__()
        self._stamper = stamper

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        result = func(*args, **(kwargs or {}))
        if loss_ops.is_loss_function(func):
            self._stamper.mark_loss()
        return result


@contextmanager
def _stamping(stamper: _Stamper) -> Iterator[None]:
    original = fx.Graph.create_node

    def create_node(graph: fx.Graph, *args: Any, **kwargs: Any) -> fx.Node:
        node = original(graph, *args, **kwargs)
        stamper.stamp(node)
        return node

    fx.Graph.create_node = create_node  # type: ignore[method-assign]
    previous_hook = loss_ops.loss_hook()
    loss_ops.set_loss_hook(stamper.mark_loss)
    try:
        with _LossFunctions(stamper):
            yield
    finally:
        loss_ops.set_loss_hook(previous_hook)
        fx.Graph.create_node = original  # type: ignore[method-assign]


@contextmanager
def _no_torch_stack_traces() -> Iterator[None]:
    """torch.export records no stack trace of its own: the stamper gives each node the user's
    line (``location`` and ``stack_trace``), where torch walked and symbolised the whole stack
    for every node it made, a tenth of the export of a BERT (cProfile of the transformers tests:
    9.5 of 96 s)."""
    before = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = before


@contextmanager
def _quiet_export() -> Iterator[None]:
    """Keep torch.export's own reports of a failed export off the user's terminal.

    On failure it prints the partial graph to stderr and symbolic_shapes warns; poptorch_sim's
    ``TraceFailure`` (and the executor's warning) says what matters, naming the user's line.
    Whatever else reaches stderr meanwhile is written out afterwards.
    """
    shapes = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    level = shapes.level
    shapes.setLevel(logging.ERROR)
    buffer = io.StringIO()
    try:
        with redirect_stderr(buffer):
            yield
    except Exception as exc:
        partial = str(getattr(exc, "partial_fx_graph", "") or "")
        rest = buffer.getvalue().replace(partial, "").strip("\n")
        if rest:
            sys.stderr.write(rest + "\n")
        raise
    else:
        sys.stderr.write(buffer.getvalue())
    finally:
        shapes.setLevel(level)


class _FlatInputs(nn.Module):
    """Calls the model with its tensor inputs passed flat (the program's input order)."""

    def __init__(
        self,
        model: nn.Module,
        signature: inspect.Signature,
        call: tuple[tuple[Any, ...], dict[str, Any]],
        stamper: _Stamper,
    ) -> None:
        super().__init__()
        setattr(self, _ROOT, model)
        self._signature = signature
        self._call = call
        self._stamper = stamper

    def forward(self, *tensors: torch.Tensor) -> Any:
        flat = iter(tensors)
        args, kwargs = map_tensor_inputs(self._signature, *self._call, lambda _n, _t: next(flat))
        self._stamper.active = True
        try:
            return flat_outputs(getattr(self, _ROOT)(*args, **kwargs))
        finally:
            self._stamper.active = False


def _export_error(model: nn.Module, exc: BaseException) -> TraceFailure:
    where = _user_location(traceback.extract_tb(exc.__traceback__))
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "in output, which is not a known type" in first:
        fix = (
            "forward returns an object whose tensors torch's pytree cannot reach (capture "
            "flattens transformers' DynamicCache and EncoderDecoderCache; see [Note: cache "
            "objects in the outputs]). Return its tensors instead, or register the class with "
            "torch.utils._pytree.register_pytree_node."
        )
    elif "data-dependent" in str(exc) or "DataDependent" in type(exc).__name__:
        fix = (
            "Control flow on tensor values (if/while on a tensor, .item(), .tolist(), nonzero "
            "sizes) depends on data no capture has. Make that code depend on shapes or "
            "constants only, or move it out of forward."
        )
    else:
        fix = (
            "forward raised this while torch.export ran it on fake tensors; if it is a bug in "
            "forward, the eager run that follows raises it again."
        )
    return TraceFailure(
        f"poptorch_sim cannot capture {type(model).__name__}.forward with torch.export "
        f"(non-strict): {type(exc).__name__}: {first}\n  at {where}\n{fix}"
    )


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for atom in target.split("."):
        obj = getattr(obj, atom)
    return obj


class _Rebuild:
    """Copies an exported graph into the ``Trace`` contract (see [Note: capture by ...])."""

    def __init__(self, ep: ExportedProgram, input_names: list[str]) -> None:
        self.ep = ep
        self.graph = fx.Graph()
        self.constants: dict[str, Any] = {}
        self._constant_ids: dict[int, str] = {}
        self._input_names = iter(input_names)
        self.input_names: list[str] = []
        self._stamps: dict[str, Any] = {}
        self._kinds = {spec.arg.name: spec for spec in ep.graph_signature.input_specs}

    def constant(self, value: Any) -> fx.Node:
        name = self._constant_ids.get(id(value))
        if name is None:
            name = f"{_CONSTANT_PREFIX}{len(self.constants)}"
            self.constants[name] = value
            self._constant_ids[id(value)] = name
        return self.graph.get_attr(name)

    def placeholder(self, node: fx.Node) -> fx.Node:
        spec = self._kinds[node.name]
        if spec.kind is InputKind.USER_INPUT:
            made = self.graph.placeholder(next(self._input_names))
            self.input_names.append(made.name)  # fx renames e.g. ``input`` (a builtin)
            return made
        target = str(spec.target)
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            return self.graph.get_attr(target.removeprefix(f"{_ROOT}."))
        return self.constant(self.ep.constants[target])

    def copy(self, graph: fx.Graph, env: dict[fx.Node, Any], module: nn.Module) -> Any:
        """Copy ``graph``'s nodes; returns what its output node returns (mapped)."""
        for node in graph.nodes:
            if node.op == "placeholder":
                if node not in env:  # an inlined region's placeholders are mapped already
                    env[node] = self.placeholder(node)
            elif node.op == "get_attr":
                env[node] = _attr(module, str(node.target))
            elif node.op == "output":
                return fx.map_arg(node.args[0], env.__getitem__)
            elif _GRAD_HOP is not None and node.target is _GRAD_HOP:
                env[node] = self.inline(node, env)
            elif node.target is operator.getitem and isinstance(env[node.args[0]], tuple):
                env[node] = env[node.args[0]][node.args[1]]  # an inlined region's result
            else:
                env[node] = self.op(node, env)
        raise AssertionError("exported graph has no output node")

    def op(self, node: fx.Node, env: dict[fx.Node, Any]) -> fx.Node | None:
        """Copy an op; ops export added after ``forward`` ran take the stamps of the op before.

        ``_assert_tensor_metadata`` checks (added for ``.to()`` calls) are dropped: they check
        what the trace already fixed, and would tie their inputs to a stage of their own. So are
        ``torch.ops.poptorch`` markers without outputs: they did their work (block entries, name
        scopes) while ``forward`` was captured.
        """
        if node.target is _ASSERT_METADATA or node.target in CAPTURE_ONLY:
            return None
        copied = self.graph.node_copy(node, lambda a: self.value(env[a]))
        if "block_entry" in copied.meta:
            self._stamps = {k: copied.meta[k] for k in _STAMPS if k in copied.meta}
        else:
            copied.meta.update(self._stamps)
        return copied

    def value(self, value: Any) -> Any:
        """A node of the new graph for ``value`` (objects become constants)."""
        return value if isinstance(value, fx.Node) else self.constant(value)

    def inline(self, node: fx.Node, env: dict[fx.Node, Any]) -> tuple[Any, ...]:
        """The body of ``wrap_with_set_grad_enabled(enabled, body, *args)``, copied in place."""
        enabled, body, *operands = node.args
        sub = env[body] if isinstance(body, fx.Node) else body
        inner: dict[fx.Node, Any] = {}
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for ph, arg in zip(placeholders, operands):
            inner[ph] = env[arg] if isinstance(arg, fx.Node) else arg
        before = set(self.graph.nodes)
        result = self.copy(sub.graph, inner, sub)
        for new in self.graph.nodes:
            if new not in before and new.op not in ("placeholder", "get_attr"):
                new.meta["grad_enabled"] = bool(enabled)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _rebuild(ep: ExportedProgram, input_names: list[str]) -> _Rebuild:
    rebuild = _Rebuild(ep, input_names)
    outputs = rebuild.copy(ep.graph_module.graph, {}, ep.graph_module)
    rebuild.graph.output(list(outputs))
    rebuild.graph.lint()
    return rebuild


def export_model(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Trace:
    """Capture ``model.forward(*args, **kwargs)`` with torch.export, recording its block entries.

    Args:
        model: the module (its parameters are referenced, never copied).
        args: example positional arguments (tensors become inputs, the rest constants).
        kwargs: example keyword arguments.

    Returns:
        The ``Trace`` (ATen ops; ``out_spec`` set).

    Raises:
        TraceFailure: ``forward`` cannot be exported (the message names the user's line).
    """
    signature = inspect.signature(type(model).forward)
    signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    names: list[str] = []
    tensors: list[torch.Tensor] = []

    def collect(name: str, tensor: torch.Tensor) -> torch.Tensor:
        names.append(name)
        tensors.append(tensor)
        return tensor

    map_tensor_inputs(signature, args, kwargs, collect)
    recorder = _Recorder()
    stamper = _Stamper(recorder)
    flat = _FlatInputs(model, signature, (args, kwargs), stamper)
    with (
        _TRACE_LOCK,
        torch.enable_grad(),
        running_on_ipu(),
        recording_blocks(recorder),
        _module_state_restored(model),
    ):
        try:
            with _stamping(stamper), _no_torch_stack_traces(), _quiet_export():
                ep = torch.export.export(flat, tuple(tensors), strict=False)
        except Exception as exc:
            if _is_tracing_failure(exc):
                raise _export_error(model, exc) from exc
            raise
    rebuilt = _rebuild(ep, names)
    return Trace(
        graph=rebuilt.graph,
        root=model,
        constants=rebuilt.constants,
        entries=recorder.entries,
        signature=signature,
        input_names=tuple(rebuilt.input_names),
        out_spec=ep.module_call_graph[0].signature.out_spec,
        capture="torch.export",
    )
