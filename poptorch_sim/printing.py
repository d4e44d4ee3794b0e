"""``poptorch.print`` and ``poptorch.module_repr``: a module's repr with its BeginBlock marks.

``BeginBlock`` works through a forward-pre-hook, which ``repr(module)`` does not show. These
show each annotated sub-module prefixed with its block, e.g.::

    Network(
      (layer1): Linear(in_features=4, out_features=4, bias=True)
      (layer2): BeginBlock(user_id=B2, ipu_id=1) Linear(in_features=4, out_features=2, bias=True)
    )
"""

from __future__ import annotations

import builtins

from torch import nn

from .ops.blocks import block_hooks

__all__ = ["print", "module_repr"]


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def module_repr(m: nn.Module) -> str:
    """``repr(m)`` with the ``BeginBlock`` annotation of every (sub-)module shown before it.

    >>> module_repr(BeginBlock(nn.ReLU(), "B1", ipu_id=0))
    'BeginBlock(user_id=B1, ipu_id=0) ReLU()'
    """
    extra = m.extra_repr()
    extra_lines = extra.split("\n") if extra else []
    children = [f"({name}): {_indent(module_repr(child))}" for name, child in m.named_children()]
    marks = "".join(f"{hook!r} " for hook in block_hooks(m))
    head = f"{marks}{m._get_name()}("
    if not extra_lines and not children:
        return head + ")"
    if len(extra_lines) == 1 and not children:
        return f"{head}{extra_lines[0]})"
    body = "\n  ".join(extra_lines + children)
    return f"{head}\n  {body}\n)"


def print(m: object) -> None:  # noqa: A001 - PopTorch's public name
    """Print ``module_repr(m)`` for a module (then ``m`` itself, as PopTorch does).

    Args:
        m: a module or any object (printed as the builtin ``print`` would).
    """
    if isinstance(m, nn.Module):
        builtins.print(module_repr(m))
    builtins.print(m)
