"""The optimizer kinds the fused kernels run, each one's hyper-parameters and their checks."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DEFAULTS", "KINDS", "check_accum_type", "checked_hyperparameters"]

# Hyper-parameters of each kind with their defaults (torch.optim's; PopTorch's for LAMB).
DEFAULTS: dict[str, dict[str, Any]] = {
    "sgd": dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                maximize=False),
    "adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False,
                 bias_correction=True),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, maximize=False,
                  bias_correction=True),
    "rmsprop": dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                    centered=False, maximize=False, use_tf_variant=False),
    "lamb": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 max_weight_norm=65500.0, bias_correction=True),
}  # fmt: skip
KINDS = tuple(DEFAULTS)

# Group keys torch optimizers carry that have no effect here (accepted and ignored).
_TORCH_ONLY_KEYS = {"foreach", "differentiable", "fused", "capturable", "amsgrad",
                    "decoupled_weight_decay", "initial_lr", "params"}  # fmt: skip

_ACCUM_TYPES = (torch.float32, torch.float16)


def check_accum_type(dtype: torch.dtype) -> None:
    """Refuses an accumulation or state dtype other than float32/float16.

    Raises:
        AssertionError: with PopTorch's wording (python/optim.py).

    >>> check_accum_type(torch.float16)
    """
    if dtype not in _ACCUM_TYPES:
        raise AssertionError(
            f"Accumulation types must be either torch.float32 or torch.float16, got {dtype}"
        )


def checked_hyperparameters(kind: str, group: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters of ``kind`` that ``group`` sets (torch-only keys dropped).

    Args:
        kind: one of ``KINDS``.
        group: a param-group dict, e.g. one of a torch optimizer's ``param_groups``.

    Raises:
        ValueError: AMSGrad, or a key that is neither ``kind``'s nor torch-only.

    >>> checked_hyperparameters("sgd", {"params": [], "lr": 0.1, "foreach": None})
    {'lr': 0.1}
    """
    if group.get("amsgrad", False):
        raise ValueError("Only non-amsgrad Adam/AdamW optimizers are supported.")
    known = DEFAULTS[kind]
    unknown = sorted(k for k in group if k not in known and k not in _TORCH_ONLY_KEYS)
    if unknown:
        raise ValueError(
            f"unknown {kind} hyper-parameter(s) {unknown} (known: {', '.join(sorted(known))})"
        )
    return {k: v for k, v in group.items() if k in known}
