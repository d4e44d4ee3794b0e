"""Finding the final loss of a traced model (PopTorch's one-final-loss rule, reference §2.4).

A loss is a call of a torch loss module or function, or of ``poptorch.identity_loss`` (the
catalogue is ``poptorch_sim.ops.loss``). A loss whose value reaches another loss through any
chain of ops is demoted to a plain value; exactly one final loss must remain.
"""

from __future__ import annotations

import torch.fx as fx

from ..errors import Error
from ..ops.loss import MANY_LOSSES, NO_LOSS, is_loss_callable
from .tracer import Trace

__all__ = ["find_final_loss", "NO_LOSS", "MANY_LOSSES"]


def _is_loss(node: fx.Node, trace: Trace) -> bool:
    if node.meta.get("loss"):  # marked while captured (torch.export)
        return True
    if node.op == "call_module":
        return is_loss_callable(trace.resolve(str(node.target)))
    if node.op == "call_function":
        return is_loss_callable(node.target)
    return False


def _reaches_another(loss: fx.Node, losses: set[fx.Node]) -> bool:
    seen: set[fx.Node] = set()
    todo = list(loss.users)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        if node in losses:
            return True
        seen.add(node)
        todo.extend(node.users)
    return False


def find_final_loss(trace: Trace) -> fx.Node:
    """The node computing the model's final loss.

    Raises:
        poptorch.Error: no loss, or more than one final loss (PopTorch's messages).
    """
    losses = [node for node in trace.graph.nodes if _is_loss(node, trace)]
    if not losses:
        raise Error(NO_LOSS)
    loss_set = set(losses)
    final = [loss for loss in losses if not _reaches_another(loss, loss_set)]
    if len(final) != 1:
        names = ", ".join(f"'{n.name}'" for n in final)
        raise Error(f"{MANY_LOSSES} (final losses: {names})")
    return final[0]
