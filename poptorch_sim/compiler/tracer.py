"""Tracing ``forward`` with torch.fx, each op stamped with the block entry that was active.

See [Note: blocks are recorded, not executed] in ``poptorch_sim/ops/blocks.py``. The tracer
installs a ``_Recorder`` while ``forward`` runs on proxies (with ``isRunningOnIpu()`` True) and
stamps every node it creates:

    node.meta["block_entry"]   index into ``Trace.entries`` (None: before the first block)
    node.meta["after_exit"]    True when a ``with Block`` had ended and no block was active
    node.meta["location"]      ``file:line in function: code`` of the user line that made it
    node.meta["stack_trace"]   the same line in fx's (traceback) format
    node.meta["grad_enabled"]  whether it was traced outside ``torch.no_grad()``

Tensor constants created inside ``forward`` are kept in ``Trace.constants`` instead of being
added to the user's module (fx's default). ``identity_loss`` is traced as one node so the loss
finder can see it, wherever the model imported it from.
"""

from __future__ import annotations

import inspect
import linecache
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from ..errors import Error
from ..ipu_context import running_on_ipu
from ..ops.blocks import block_hooks, recording_blocks
from ..ops.loss import identity_loss
from .signature import map_tensor_inputs

__all__ = ["BlockEntry", "Trace", "trace_model", "TraceFailure"]

# Held under another name: every module-level ``identity_loss`` is patched while tracing.
_IDENTITY_LOSS = identity_loss

# fx patches torch.nn.Module globally while it traces: one trace at a time per process.
_TRACE_LOCK = threading.RLock()
_CONSTANT_PREFIX = "_poptorch_sim_constant"


class BlockEntry(NamedTuple):
    """One entry into a block, in program order."""

    block_id: str
    ipu_id: int | None
    location: str


class _Recorder:
    """The ``BlockRecorder`` of one trace."""

    def __init__(self) -> None:
        self.entries: list[BlockEntry] = []
        self.current: int | None = None
        self.after_exit = False
        self._next_auto_id = 0

    def begin_block(self, user_id: str | None, ipu_id: int | None) -> None:
        block_id = user_id or self.next_auto_id()
        self.entries.append(BlockEntry(block_id, ipu_id, _user_frame()[0]))
        self.current = len(self.entries) - 1
        self.after_exit = False

    def end_block(self) -> None:
        self.after_exit = True

    def next_auto_id(self) -> str:
        self._next_auto_id += 1
        return str(self._next_auto_id - 1)

    def reset_auto_id(self) -> None:
        self._next_auto_id = 0


@dataclass
class Trace:
    """What tracing ``forward`` produced.

    Attributes:
        graph: the traced graph (placeholders are the program inputs).
        root: the traced module (``get_attr`` / ``call_module`` targets resolve in it).
        constants: objects ``forward`` uses that the model does not own (tensors and modules
            created inside ``forward``), by target name.
        entries: the block entries, in program order.
        signature: ``forward``'s signature (to flatten later calls' inputs).
        input_names: the placeholders' names, in ``flatten_inputs`` order.
        out_spec: how the output node's flat list of leaves rebuilds ``forward``'s return value;
            None when the output node holds the return structure itself (fx).
        capture: which front end made it ("torch.fx" or "torch.export").
    """

    graph: fx.Graph
    root: nn.Module
    constants: dict[str, Any]
    entries: list[BlockEntry]
    signature: inspect.Signature
    input_names: tuple[str, ...] = field(default=())
    out_spec: pytree.TreeSpec | None = None
    capture: str = "torch.fx"

    def resolve(self, target: str) -> Any:
        """The object a ``get_attr`` / ``call_module`` target names (shared, not copied)."""
        if target in self.constants:
            return self.constants[target]
        obj: Any = self.root
        for atom in target.split("."):
            obj = getattr(obj, atom)
        return obj

    def graph_module(self, graph: fx.Graph | None = None, name: str = "Traced") -> fx.GraphModule:
        """A GraphModule running ``graph`` (default: the whole trace) on the shared objects."""
        graph = self.graph if graph is None else graph
        targets = {
            str(n.target): self.resolve(str(n.target))
            for n in graph.nodes
            if n.op in ("get_attr", "call_module")
        }
        return fx.GraphModule(targets, graph, class_name=name)


class TraceFailure(Error):
    """``forward`` could not be traced symbolically (names the construct and the source line)."""


class _SimTracer(fx.Tracer):
    """fx tracer that stamps block entries, runs BeginBlock hooks and keeps constants aside."""

    def __init__(self, recorder: _Recorder, args: tuple[Any, ...], kwargs: dict[str, Any]):
        super().__init__(autowrap_functions=(_IDENTITY_LOSS,))
        self.recorder = recorder
        self._call = (args, kwargs)
        self.constants: dict[str, Any] = {}
        self._constant_ids: dict[int, str] = {}
        self.input_names: list[str] = []

    def create_node(self, kind: str, target: Any, args: Any, kwargs: Any, *rest: Any, **kw: Any):
        node = super().create_node(kind, target, args, kwargs, *rest, **kw)
        node.meta["block_entry"] = self.recorder.current
        node.meta["after_exit"] = self.recorder.after_exit
        if kind not in ("placeholder", "output"):
            node.meta["location"], node.meta["stack_trace"] = _user_frame()
            node.meta["grad_enabled"] = torch.is_grad_enabled()
        return node

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        # fx emits leaf modules as nodes without running their hooks; BeginBlock needs its hook.
        if self.is_leaf_module(m, self.path_of_module(m)):
            for hook in block_hooks(m):
                hook(m, args)
        return super().call_module(m, forward, args, kwargs)

    def _extra(self, value: Any) -> str:
        """A name for an object the model does not own (kept in ``constants``, not set on it)."""
        name = self._constant_ids.get(id(value))
        if name is None:
            name = f"{_CONSTANT_PREFIX}{len(self.constants)}"
            self.constants[name] = value
            self._constant_ids[id(value)] = name
        return name

    def path_of_module(self, mod: nn.Module) -> str:
        try:
            return super().path_of_module(mod)
        except NameError:  # a module created inside forward
            return self._extra(mod)

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor) and not self._is_module_tensor(a):
            return self.create_node("get_attr", self._extra(a), (), {})
        return super().create_arg(a)

    def _is_module_tensor(self, a: torch.Tensor) -> bool:
        if a in self.tensor_attrs:
            return True
        owned = self.root.parameters() if isinstance(a, nn.Parameter) else self.root.buffers()
        return any(a is b for b in owned)

    def create_args_for_root(self, root_fn: Any, is_module: bool, concrete_args: Any = None):
        args, kwargs = self._call

        def placeholder(name: str, tensor: torch.Tensor) -> fx.Proxy:
            proxy = self.create_proxy("placeholder", name, (), {})
            self.input_names.append(proxy.node.name)
            return proxy

        signature = inspect.signature(root_fn)
        bound_self = signature.replace(parameters=list(signature.parameters.values())[1:])
        p_args, p_kwargs = map_tensor_inputs(bound_self, args, kwargs, placeholder)

        def traced_forward(root: nn.Module) -> Any:
            for hook in block_hooks(root):
                hook(root, p_args)
            return root_fn(root, *p_args, **p_kwargs)

        return traced_forward, [self.root]


def _is_library_file(path: str) -> bool:
    path = path.replace("\\", "/")
    return "/torch/" in path or "/poptorch_sim/" in path or path.startswith("<")


def _describe_frame(filename: str, lineno: int, name: str) -> str:
    code = linecache.getline(filename, lineno).strip()
    return f"{filename}:{lineno} in {name}: {code}"


def _user_location(tb: list[traceback.FrameSummary]) -> str:
    """``file:line in function: code`` of the innermost traceback frame of user code."""
    for summary in reversed(tb):
        if not _is_library_file(summary.filename):
            return _describe_frame(summary.filename, summary.lineno or 0, summary.name)
    return "<unknown location>"


def _user_frame() -> tuple[str, str]:
    """The innermost calling frame of user code: ``(location, fx-style stack_trace)``."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not _is_library_file(code.co_filename):
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            location = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}: {line}"
            stack = (
                f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n    {line}'
            )
            return location, stack
        frame = frame.f_back
    return "<unknown location>", ""


def _is_tracing_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means "fx could not trace this", not a PopTorch error to pass on.

    Anything but poptorch's own errors (block annotations checked while tracing) counts: fx's
    ``TraceError``, but also what library code does with proxies in place of tensors (a proxy
    used as a slice index in Hugging Face's BERT raises a bare ``TypeError``). A real bug in
    ``forward`` shows up again, with its own traceback, when the model then runs eagerly.
    """
    return not isinstance(exc, (Error, AssertionError))


def _tracing_error(model: nn.Module, exc: BaseException) -> TraceFailure:
    where = _user_location(traceback.extract_tb(exc.__traceback__))
    return TraceFailure(
        f"poptorch_sim cannot trace {type(model).__name__}.forward symbolically (torch.fx), "
        f"which it must do to split the model into blocks: {type(exc).__name__}: {exc}\n"
        f"  at {where}\n"
        "Python control flow, len(), iteration or conversions on tensor values depend on data "
        "the tracer does not have. Make that code depend on shapes or constants only, move it "
        "out of forward, or wrap it in a function registered with torch.fx.wrap."
    )


@contextmanager
def _identity_loss_as_leaf(tracer: _SimTracer) -> Iterator[None]:
    """Make every module-level ``identity_loss`` name record one node while tracing."""

    def traced_identity_loss(x: Any, reduction: str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, fx.Proxy):
            _IDENTITY_LOSS(torch.zeros(()), reduction)  # validates ``reduction`` now
            return tracer.create_proxy("call_function", _IDENTITY_LOSS, (x, reduction), {})
        return _IDENTITY_LOSS(x, reduction, *args, **kwargs)

    patched = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get("identity_loss") is _IDENTITY_LOSS:
            namespace["identity_loss"] = traced_identity_loss
            patched.append(namespace)
    try:
        yield
    finally:
        for namespace in patched:
            namespace["identity_loss"] = _IDENTITY_LOSS


@contextmanager
def _module_state_restored(model: nn.Module) -> Iterator[None]:
    """Undo what ``forward`` assigned to the modules while traced (``self.buf += x`` stores a
    Proxy in ``_buffers``; ``self.attr = x`` one in ``__dict__``)."""
    saved = [
        (m, dict(m.__dict__), dict(m._buffers), dict(m._parameters), dict(m._modules))
        for m in model.modules()
    ]
    try:
        yield
    finally:
        for m, attrs, buffers, params, modules in saved:
            for store, old in (
                (m._buffers, buffers),
                (m._parameters, params),
                (m._modules, modules),
                (m.__dict__, attrs),
            ):
                store.clear()
                store.update(old)


def _run(tracer: _SimTracer, model: nn.Module) -> fx.Graph:
    with (
        _TRACE_LOCK,
        torch.enable_grad(),
        running_on_ipu(),
        recording_blocks(tracer.recorder),
        _identity_loss_as_leaf(tracer),
        _module_state_restored(model),
    ):
        try:
            return tracer.trace(model)
        except Exception as exc:
            if _is_tracing_failure(exc):
                raise _tracing_error(model, exc) from exc
            raise


def trace_model(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Trace:
    """Trace ``model.forward(*args, **kwargs)`` symbolically, recording its block entries.

    Args:
        model: the module (its parameters are referenced, never copied).
        args: example positional arguments (tensors become inputs, the rest constants).
        kwargs: example keyword arguments.

    Returns:
        The ``Trace``.

    Raises:
        TraceFailure: ``forward`` cannot be traced (the message names the construct and line).
    """
    tracer = _SimTracer(_Recorder(), args, kwargs)
    graph = _run(tracer, model)
    signature = inspect.signature(type(model).forward)
    signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return Trace(
        graph=graph,
        root=model,
        constants=tracer.constants,
        entries=tracer.recorder.entries,
        signature=signature,
        input_names=tuple(tracer.input_names),
    )


def entries_seen(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether tracing ``forward`` enters any block (False when it cannot be traced before one).

    Raises:
        TraceFailure: tracing failed after a block was entered (the model needs the compiler).
    """
    tracer = _SimTracer(_Recorder(), args, kwargs)
    try:
        _run(tracer, model)
    except Exception:
        if not tracer.recorder.entries:
            return False
        raise
    return bool(tracer.recorder.entries)
