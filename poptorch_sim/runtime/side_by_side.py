"""Inference micro-batches computed side by side, one worker thread per core.

[Note: micro-batches side by side]
An inference call's micro-batches do not depend on each other: each one's outputs are a
function of its inputs and the weights alone, whatever order they are computed in. On a CPU
with few cores an op on every core does not go as fast as the cores would on their own
(libgomp's barriers, memory traffic of the smaller ops; dev-zen4's ceiling: 512-wide matmuls
1.23 times as fast on 2 threads as on 1), so an inference pipeline on the CPU whose stages can
run concurrently has one more mode in its trials (See [Note: cores follow the work]): one
worker thread per core of the program (the caller's intra-op count), each holding every stage
and computing on one intra-op thread, and micro-batch ``m`` computed by worker ``m mod
copies``, forward through every stage in the order of the sharded schedule placed on one IPU
(as the one-thread mode runs them; See [Note: one thread for a sharded program]). The copies
share the stage executors: inference keeps no state between a stage's forward and the next.
Measured before it was built, eager PyTorch's own inference loop against the same micro-batches
on two threads of one intra-op thread each (``benchmarks/models.py``'s sizes, dev-zen4, quiet,
medians of 7): T5 1.16x, ViT 1.14x, BERT 1.23x as fast; GPT-2 0.96x (its 50,257-wide LM head
gains from both cores on one op). The trials keep whichever mode they measure fastest: on the
scoreboard they chose side by side for T5, GPT-2 and most sharded rows (T5 inference 0.93 /
0.95 of eager -> 1.15 / 1.16, GPT-2 1.17-1.18 -> 1.26-1.29) and one thread for ResNet-50,
whose convolutions gain from both cores (``benchmarks/RESULTS.md``).

The same ops meet the same values; only the intra-op thread count of each op changes (one),
which may change the last bits of a reduction exactly as ``torch.set_num_threads`` does in
eager PyTorch. The mode is offered only where computing two micro-batches at once cannot
change what a program computes (``independent_micro_batches``): every stage is an fx graph of
PyTorch's own ops and of ``torch.nn`` layers that keep no state (eval mode, or no buffers and no
dropout); nothing draws random numbers
(a dropout whose ``train`` is ``False`` draws nothing); and no op writes into a parameter or a
buffer (through a view of it included). Python call-backs (``poptorch.CPU``), printing and
other user functions in the graph keep the other modes, which run one micro-batch after
another. The trace puts each copy's spans on a track of its own under the stage's IPU
(``side 1`` and so on, copy 0 on the IPU's own track).
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Iterable

import torch
from torch import fx, nn

from .actions import Action
from .stage import RANDOM_NAMES

__all__ = ["independent_micro_batches", "side_actions", "track_of"]

_RANDOM = (*RANDOM_NAMES, "seed")
_VIEWS = frozenset(
    (
        "alias",
        "as_strided",
        "chunk",
        "contiguous",
        "detach",
        "diagonal",
        "expand",
        "expand_as",
        "flatten",
        "getitem",
        "__getitem__",
        "movedim",
        "narrow",
        "permute",
        "reshape",
        "select",
        "slice",
        "split",
        "squeeze",
        "t",
        "transpose",
        "unbind",
        "unflatten",
        "unfold",
        "unsqueeze",
        "view",
        "view_as",
    )
)
_IN_PLACE_OPERATORS = frozenset(
    (operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv)
)
_IN_PLACE_DUNDERS = frozenset(("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__"))
_BUILTINS = frozenset((builtins.getattr, builtins.len))


def independent_micro_batches(modules: Iterable[nn.Module]) -> bool:
    """Whether every module computes each micro-batch from its inputs and weights alone, so
    that micro-batches may run at once on several threads (See [Note: micro-batches side by
    side])."""
    return all(isinstance(m, fx.GraphModule) and _independent(m) for m in modules)


def side_actions(actions: Iterable[Action], copies: int, copy: int) -> tuple[Action, ...]:
    """The actions of micro-batches ``m`` with ``m mod copies == copy``, in their order."""
    return tuple(a for a in actions if a.mb is not None and a.mb % copies == copy)


def track_of(copy: int) -> str:
    """The trace track of a copy's spans ("" for the first: its IPU's own track)."""
    return f"side {copy}" if copy else ""


def _independent(module: fx.GraphModule) -> bool:
    for node in module.graph.nodes:
        if node.op == "call_module":
            layer = module.get_submodule(str(node.target))
            if isinstance(layer, fx.GraphModule):
                if not _independent(layer):
                    return False
            elif not _stateless_layer(layer):
                return False
        elif node.op in ("call_function", "call_method"):
            if node.op == "call_function" and not _known_function(node.target):
                return False
            if _draws(node) or _writes_state(node):
                return False
    return True


def _stateless_layer(layer: nn.Module) -> bool:
    """A ``torch.nn`` layer that neither draws nor updates buffers (eval mode, or no buffers
    and no dropout)."""
    if not type(layer).__module__.startswith("torch.nn."):
        return False
    if not layer.training:
        return True
    return not isinstance(layer, nn.modules.dropout._DropoutNd) and not any(
        True for _ in layer.buffers()
    )


def _known_function(target: object) -> bool:
    """PyTorch's own operators and functions, and the operator module's (no user code)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return target.namespace in ("aten", "prims")
    if target in _BUILTINS:
        return True
    module = getattr(target, "__module__", None) or ""
    return module == "_operator" or module == "torch" or module.startswith("torch.")


def _name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]  # "add_.Tensor"


def _draws(node: fx.Node) -> bool:
    name = _name(node).lower()
    if name == "normalize" or not any(word in name for word in _RANDOM):
        return False
    if "dropout" in name:  # aten.dropout(x, p, train) and F.dropout(x, p, training)
        off = node.args[2:3] == (False,) or False in (
            node.kwargs.get("train"),
            node.kwargs.get("training"),
        )
        return not off
    return True


def _writes_state(node: fx.Node) -> bool:
    """Whether ``node`` writes into a parameter or buffer (``get_attr``), or a view of one."""
    name = _name(node)
    in_place = (
        node.target in _IN_PLACE_OPERATORS
        or name in _IN_PLACE_DUNDERS
        or (name.endswith("_") and not name.endswith("__") and name != "requires_grad_")
    )
    if not in_place or not node.args:
        return False
    base = node.args[0]
    while isinstance(base, fx.Node) and base.op != "get_attr":
        if base.op not in ("call_function", "call_method") or _name(base) not in _VIEWS:
            return False
        base = base.args[0] if base.args else None
    return isinstance(base, fx.Node)
