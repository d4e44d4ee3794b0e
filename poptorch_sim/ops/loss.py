"""Losses: ``identity_loss`` and the catalogue of torch losses PopTorch recognises as losses."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "identity_loss",
    "LOSS_FUNCTIONS",
    "LOSS_MODULES",
    "is_loss_callable",
    "is_loss_function",
    "register_loss_op",
    "NO_LOSS",
    "MANY_LOSSES",
]

# PopTorch's two loss errors, raised by both the eager and the staged paths.
NO_LOSS = "Couldn't find a loss in graph!"
MANY_LOSSES = (
    "Multiple independent losses found in graph. Graph must have one final loss. Wrap final "
    "graph loss in poptorch.identity_loss."
)

_REDUCTIONS = ("sum", "mean", "none")


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` as the model's final loss, reduced over all its elements.

    Args:
        x: the loss tensor.
        reduction: ``"sum"``, ``"mean"`` or ``"none"`` (``x`` itself).

    Returns:
        ``x.sum()``, ``x.mean()`` or ``x``.

    Raises:
        AssertionError: an unknown reduction (PopTorch's type and wording).

    >>> identity_loss(torch.ones(2, 3), "sum")
    tensor(6.)
    """
    if reduction not in _REDUCTIONS:
        raise AssertionError("Unsupported reduction type!")
    if reduction == "sum":
        result = x.sum()
    elif reduction == "mean":
        result = x.mean()
    else:
        result = x.view_as(x)
    hook = loss_hook()
    if hook is not None:
        hook(result)
    return result


# The torch.nn losses PopTorch lowers to a loss (reference §2.4).
LOSS_MODULES: tuple[type[nn.Module], ...] = (
    nn.L1Loss,
    nn.MSELoss,
    nn.SmoothL1Loss,
    nn.HuberLoss,
    nn.NLLLoss,
    nn.CrossEntropyLoss,
    nn.BCELoss,
    nn.BCEWithLogitsLoss,
    nn.KLDivLoss,
    nn.PoissonNLLLoss,
    nn.CosineEmbeddingLoss,
    nn.TripletMarginLoss,
    nn.MultiLabelSoftMarginLoss,
    nn.CTCLoss,
    nn.HingeEmbeddingLoss,
    nn.MarginRankingLoss,
    nn.SoftMarginLoss,
)

LOSS_FUNCTIONS: tuple[Callable[..., torch.Tensor], ...] = (
    identity_loss,
    F.l1_loss,
    F.mse_loss,
    F.smooth_l1_loss,
    F.huber_loss,
    F.nll_loss,
    F.cross_entropy,
    F.binary_cross_entropy,
    F.binary_cross_entropy_with_logits,
    F.kl_div,
    F.poisson_nll_loss,
    F.cosine_embedding_loss,
    F.triplet_margin_loss,
    F.multilabel_soft_margin_loss,
    F.ctc_loss,
    F.hinge_embedding_loss,
    F.margin_ranking_loss,
    F.soft_margin_loss,
)


_LOSS_FUNCTION_IDS = frozenset(map(id, LOSS_FUNCTIONS))


def is_loss_function(fn: object) -> bool:
    """Whether ``fn`` is one of ``LOSS_FUNCTIONS`` (a set lookup: capture asks it of every
    torch function call)."""
    return id(fn) in _LOSS_FUNCTION_IDS


# Dispatcher ops that are losses (``torch.ops.poptorch.identity_loss``: fx records the packet,
# torch.export the overload).
_LOSS_OPS: list[object] = []


def register_loss_op(packet: torch._ops.OpOverloadPacket) -> None:
    """Count calls of the op ``packet`` (any of its overloads) as losses."""
    _LOSS_OPS.extend([packet, *(getattr(packet, name) for name in packet.overloads())])


def is_loss_callable(fn: object) -> bool:
    """Whether calling ``fn`` computes a loss in PopTorch's sense (a loss module or function)."""
    return (
        isinstance(fn, LOSS_MODULES) or is_loss_function(fn) or any(fn is op for op in _LOSS_OPS)
    )


# Per thread: models compile, and replicas run their micro-batches, on threads of their own, and
# each records its own losses (as torch's function modes, which LossRecorder is, are per thread).
_hooks = threading.local()


def loss_hook() -> Callable[[torch.Tensor], None] | None:
    """The callback ``identity_loss`` reports its result to on this thread, if any."""
    return getattr(_hooks, "hook", None)


def set_loss_hook(hook: Callable[[torch.Tensor], None] | None) -> None:
    """Install (or clear) the callback ``identity_loss`` reports its result to while recording
    on this thread."""
    _hooks.hook = hook
