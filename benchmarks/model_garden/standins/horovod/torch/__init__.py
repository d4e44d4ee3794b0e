"""``horovod.torch`` for one process: see ``horovod/__init__.py``."""

from __future__ import annotations

from typing import Any

import torch

Average, Sum, Adasum = 0, 1, 2


def init(*args: Any, **kwargs: Any) -> None:
    """Nothing to join: one process."""


def size() -> int:
    return 1


def local_size() -> int:
    return 1


def rank() -> int:
    return 0


def local_rank() -> int:
    return 0


def allreduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Sum or average over one process: the tensor itself (a copy)."""
    return tensor.clone()


def grouped_allreduce(tensors: list[torch.Tensor], *args: Any, **kwargs: Any):
    return [t.clone() for t in tensors]


def allgather(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Concatenation along dim 0 over one process."""
    return tensor.clone()


def broadcast(tensor: torch.Tensor, root_rank: int = 0, *args: Any, **kwargs: Any):
    return tensor.clone()


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Every process already holds process 0's parameters."""


def broadcast_object(obj: Any, root_rank: int = 0, *args: Any, **kwargs: Any) -> Any:
    return obj
