"""``ipu_print_tensor``: an identity op that prints its tensor (and gradient) as Poplar does.

[Note: Poplar's print format]
Poplar prints ``<title>: <body>`` on stderr. A 0-d tensor's body is its value; a 1-d tensor is one
row ``(a,b,c)`` whose elements are joined by the separator character; higher ranks open a
bracket, print each sub-tensor on its own lines one space deeper, and close the bracket on a line
of its own, at the depth it opened::

    title: {                      <- rank 2, digits=8, separator " ", brackets "{}"
     {1.4962566 1.7682219}
     {1.0884774 1.1320305}
    }

A row longer than ``max_line_width`` breaks after a separator; its continuation lines are
indented one column past the row's opening bracket. ``digits`` is the number of significant
digits: "fixed" keeps ``digits`` minus the integer digits of the largest magnitude as decimals,
"scientific" prints ``digits`` mantissa digits, "auto" picks one of the two from the data and
"none" (or ``digits == 0``) formats each element on its own. Elements are right-aligned to a
common width unless ``digits == 0``. Tensors with more than ``summarise_threshold`` elements
show only ``edge_items`` at each end of every long dimension, with ``...`` between.
PopTorch passes only the first character of ``separator`` and of each bracket to Poplar.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import createPoptorchError
from .fx_leaf import fx_leaf

__all__ = ["ipu_print_tensor", "PrintFormat", "format_tensor", "prints_suppressed"]

_FLOAT_FORMATS = ("auto", "fixed", "scientific", "none")
_UNTITLED = "ipu_print_tensor"  # stands in for the PopART tensor id printed when no title is set
_stderr_lock = threading.Lock()
_quiet = threading.local()


@contextlib.contextmanager
def prints_suppressed() -> Iterator[None]:
    """Silence ``ipu_print_tensor`` in this thread inside the ``with`` block.

    The executor enters it for passes that are not device executions (compile-time checks), so
    that tensors print once per executed micro-batch, as on an IPU.

    >>> with prints_suppressed():
    ...     _ = ipu_print_tensor(torch.ones(1), "silent")
    """
    depth = getattr(_quiet, "depth", 0)
    _quiet.depth = depth + 1
    try:
        yield
    finally:
        _quiet.depth = depth


@dataclass(frozen=True)
class PrintFormat:
    """How a tensor is printed (Poplar's ``PrintTensorFmt``); see [Note: Poplar's print format]."""

    summarise_threshold: int = 1000
    edge_items: int = 3
    max_line_width: int = 80
    digits: int = 4
    float_format: str = "auto"
    separator: str = ","
    open_bracket: str = "("
    close_bracket: str = ")"


def _first_char(text: str) -> str:
    return text[:1]


def _float_formatter(values: torch.Tensor, fmt: PrintFormat) -> Callable[[float], str]:
    digits = fmt.digits
    mode = fmt.float_format if digits > 0 else "none"
    if mode == "none":
        return (lambda v: f"{v:.{digits}g}") if digits > 0 else (lambda v: f"{v:g}")
    magnitudes = values[torch.isfinite(values)].abs()
    if mode == "auto":
        mode = _auto_float_mode(magnitudes, digits)
    if mode == "scientific":
        return lambda v: f"{v:.{digits - 1}e}"
    largest = float(magnitudes.max()) if magnitudes.numel() else 0.0
    int_digits = len(str(int(largest))) if largest >= 1.0 else 1
    decimals = max(digits - int_digits, 0)
    return lambda v: f"{v:.{decimals}f}"


def _auto_float_mode(magnitudes: torch.Tensor, digits: int) -> str:
    nonzero = magnitudes[magnitudes > 0]
    if nonzero.numel() == 0:
        return "fixed"
    largest, smallest = float(nonzero.max()), float(nonzero.min())
    if largest >= 10.0**digits or smallest < 1e-4 or largest / smallest > 1e3:
        return "scientific"
    return "fixed"


def _bool_text(value: bool) -> str:
    return "true" if value else "false"


def _element_formatter(shown: torch.Tensor, fmt: PrintFormat) -> Callable[[Any], str]:
    """Return a function turning one element into its (aligned) text."""
    values = shown.double() if shown.is_floating_point() else shown
    raw: Callable[[Any], str]
    if shown.dtype == torch.bool:
        raw = _bool_text
    elif shown.is_floating_point():
        raw = _float_formatter(values.flatten(), fmt)
    else:
        raw = str
    texts = [raw(v) for v in values.flatten().tolist()]
    if fmt.digits <= 0 or not texts:
        return raw
    width = max(len(t) for t in texts)
    return lambda v: raw(v).rjust(width)


def _shown_part(t: torch.Tensor, summarise: bool, edge: int) -> torch.Tensor:
    """The elements that will be printed (the edges of every long dimension when summarising)."""
    if not summarise:
        return t
    for dim in range(t.dim()):
        size = t.shape[dim]
        if size > 2 * edge:
            keep = list(range(edge)) + list(range(size - edge, size))
            t = t.index_select(dim, torch.tensor(keep, dtype=torch.long))
    return t


def _wrap_row(items: list[str], indent: str, fmt: PrintFormat) -> list[str]:
    open_b, close_b = _first_char(fmt.open_bracket), _first_char(fmt.close_bracket)
    if not items:
        return [indent + open_b + close_b]
    sep = _first_char(fmt.separator)
    pieces = [item + sep for item in items[:-1]] + [items[-1] + close_b]
    continuation = " " * (len(indent) + len(open_b) + 1)
    lines: list[str] = []
    line = indent + open_b
    for i, piece in enumerate(pieces):
        if i > 0 and fmt.max_line_width > 0 and len(line) + len(piece) > fmt.max_line_width:
            lines.append(line.rstrip())
            line = continuation + piece
        else:
            line += piece
    lines.append(line)
    return lines


def _indices(size: int, summarise: bool, edge: int) -> list[int | None]:
    """Indices to print along a dimension; ``None`` marks the ``...`` of a summarised one."""
    if summarise and size > 2 * edge:
        return [*range(edge), None, *range(size - edge, size)]
    return list(range(size))


def _render(
    t: torch.Tensor, depth: int, fmt: PrintFormat, text: Callable[[Any], str], summarise: bool
) -> list[str]:
    indent = " " * depth
    if t.dim() == 0:
        return [indent + text(t.item())]
    picks = _indices(t.shape[0], summarise, fmt.edge_items)
    if t.dim() == 1:
        values = t.tolist()
        items = ["..." if i is None else text(values[i]) for i in picks]
        return _wrap_row(items, indent, fmt)
    lines = [indent + _first_char(fmt.open_bracket)]
    for i in picks:
        if i is None:
            lines.append(indent + " ...")
        else:
            lines.extend(_render(t[i], depth + 1, fmt, text, summarise))
    lines.append(indent + _first_char(fmt.close_bracket))
    return lines


def format_tensor(tensor: torch.Tensor, fmt: PrintFormat | None = None) -> str:
    """Return the body Poplar prints for ``tensor`` (see [Note: Poplar's print format]).

    Args:
        tensor: any tensor (detached and copied to the CPU to be printed).
        fmt: the format; ``PrintFormat()`` (PopTorch's defaults) when ``None``.

    Returns:
        The text, without the title and without a trailing newline.

    >>> format_tensor(torch.tensor([1.5, -2.0]), PrintFormat(separator=" "))
    '( 1.500 -2.000)'
    """
    fmt = fmt or PrintFormat()
    t = tensor.detach().cpu()
    summarise = 0 < fmt.summarise_threshold < t.numel()
    text = _element_formatter(_shown_part(t, summarise, fmt.edge_items), fmt)
    if t.is_floating_point():
        t = t.double()
    return "\n".join(_render(t, 0, fmt, text, summarise))


def _emit(title: str, tensor: torch.Tensor, fmt: PrintFormat) -> None:
    if getattr(_quiet, "depth", 0):
        return
    text = f"{title}: {format_tensor(tensor, fmt)}\n"
    with _stderr_lock:
        sys.stderr.write(text)
        sys.stderr.flush()


class _PrintGradient(torch.autograd.Function):
    """Identity whose backward prints the incoming gradient as ``<title>_gradient``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, title: str, fmt: PrintFormat) -> torch.Tensor:
        ctx.title = title
        ctx.fmt = fmt
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        _emit(ctx.title, grad, ctx.fmt)
        return grad, None, None


@fx_leaf()
def ipu_print_tensor(
    tensor: torch.Tensor,
    title: str = "",
    print_gradient: bool = True,
    summarise_threshold: int = 1000,
    edge_items: int = 3,
    max_line_width: int = 80,
    digits: int = 4,
    float_format: str = "auto",
    separator: str = ", ",
    open_bracket: str = "(",
    close_bracket: str = ")",
) -> torch.Tensor:
    """Print ``tensor`` on stderr each time the op runs and return it unchanged.

    Use the returned tensor in the rest of the model (on an IPU an unused print is pruned).
    With ``print_gradient`` its gradient is printed in the backward pass, titled
    ``<title>_gradient``. The format is Poplar's: see [Note: Poplar's print format].

    Simulated: the op runs once per micro-batch, as on an IPU; without a title the PopART tensor
    id is printed there, ``ipu_print_tensor`` here.

    Args:
        tensor: the tensor to print.
        title: printed before the value, followed by ``": "``.
        print_gradient: also print the gradient during the backward pass.
        summarise_threshold: above this many elements only the edges are printed (0: never).
        edge_items: elements kept at each end of a summarised dimension.
        max_line_width: longer rows are split over several lines (0: never).
        digits: significant digits (0: no alignment and each element formatted on its own).
        float_format: ``"auto"``, ``"fixed"``, ``"scientific"`` or ``"none"``.
        separator: its first character separates the elements of a row.
        open_bracket: its first character opens a tensor.
        close_bracket: its first character closes a tensor.

    Returns:
        A copy of ``tensor`` (differentiable: gradients flow through unchanged).

    Raises:
        poptorch.Error: ``tensor`` is not a ``torch.Tensor``.
        KeyError: an unknown ``float_format`` (PopTorch's type).

    >>> y = ipu_print_tensor(torch.ones(2), "ones")  # stderr: "ones: (1.000,1.000)"
    """
    if not isinstance(tensor, torch.Tensor):
        raise createPoptorchError(
            f"ipu print tensor must take a torch.tensor argument. {type(tensor)} is not supported."
        )
    if float_format not in _FLOAT_FORMATS:
        raise KeyError(
            f"float_format must be one of {', '.join(_FLOAT_FORMATS)}; got {float_format!r}"
        )
    fmt = PrintFormat(
        summarise_threshold,
        edge_items,
        max_line_width,
        digits,
        float_format,
        separator,
        open_bracket,
        close_bracket,
    )
    title = title or _UNTITLED
    _emit(title, tensor, fmt)
    if print_gradient and tensor.requires_grad and torch.is_grad_enabled():
        return _PrintGradient.apply(tensor, f"{title}_gradient", fmt)
    return tensor.clone()
