"""Choosing the capture front end that turns ``forward`` into a ``Trace``: torch.fx or torch.export.

    method    tries                                   chosen with
    "auto"    torch.fx; torch.export when fx fails    the default
    "fx"      torch.fx symbolic tracing only          opts.Jit.captureMethod("fx")
    "export"  torch.export (non-strict) only          opts.Jit.captureMethod("export")

Both front ends produce the same ``Trace`` (block stamps in ``node.meta``, parameters by name,
losses findable), so partition, verify and split never know which one ran; a debug log line
says so. fx is tried first because its graph keeps the model's modules and torch functions
(readable names, fast to trace); torch.export records ATen ops but runs ``forward`` as Python,
so shape checks and library code that fx cannot follow (Hugging Face models) just run. See
[Note: capture by torch.export] in ``exporter.py``. When both fail, the error gives both
reasons, each naming the user's line; the executor then runs the model eagerly on one IPU with
a warning.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..logger import logger
from .exporter import export_model
from .tracer import Trace, TraceFailure, trace_model

__all__ = ["CAPTURE_METHODS", "capture_model", "capture_method"]

CAPTURE_METHODS = ("auto", "fx", "export")


def capture_method(options: Any) -> str:
    """The capture method ``options`` ask for (``opts.Jit.captureMethod``; "auto" without)."""
    jit = getattr(options, "_jit", None)
    method = getattr(jit, "capture_method", "auto") if jit is not None else "auto"
    return str(method)


def capture_model(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], method: str = "auto"
) -> Trace:
    """Capture ``model.forward(*args, **kwargs)`` with the front end ``method`` names.

    Args:
        model: the module (its parameters are referenced, never copied).
        args: example positional arguments (one micro-batch).
        kwargs: example keyword arguments.
        method: "auto" (fx, then torch.export), "fx" or "export".

    Returns:
        The ``Trace``; ``trace.capture`` says which front end made it.

    Raises:
        TraceFailure: no front end allowed by ``method`` could capture ``forward``.
        ValueError: an unknown ``method``.

    >>> trace = capture_model(nn.Linear(2, 2), (torch.ones(1, 2),), {})
    >>> trace.capture
    'torch.fx'
    """
    if method not in CAPTURE_METHODS:
        raise ValueError(f"unknown capture method {method!r}; expected one of {CAPTURE_METHODS}")
    name = type(model).__name__
    fx_failure: TraceFailure | None = None
    if method != "export":
        try:
            trace = trace_model(model, args, kwargs)
        except TraceFailure as failure:
            if method == "fx":
                raise
            fx_failure = failure
            logger.debug("poptorch_sim: torch.fx could not trace %s: %s", name, failure)
        else:
            logger.debug("poptorch_sim: captured %s.forward with torch.fx symbolic tracing", name)
            return trace
    try:
        trace = export_model(model, args, kwargs)
    except TraceFailure as failure:
        if fx_failure is None:
            raise
        raise TraceFailure(f"{fx_failure}\n{failure}") from failure
    logger.debug("poptorch_sim: captured %s.forward with torch.export (non-strict)", name)
    return trace
