"""``poptorch.testing``: comparing nested results of a model with a reference."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["allclose"]


def allclose(ref: Any, other: Any) -> bool:
    """Whether ``other`` has the structure of ``ref`` and ``torch.allclose`` values.

    Args:
        ref: a tensor, or a tuple/list (nested any depth) of them; dicts are compared by key.
        other: the value to compare with ``ref``.

    Returns:
        ``True`` when the containers have the same types and lengths (same keys for dicts) and
        every tensor pair is ``torch.allclose`` (default tolerances).

    Raises:
        TypeError: ``ref`` holds something other than tensors, tuples, lists and dicts.

    >>> allclose((torch.ones(2), [torch.zeros(1)]), (torch.ones(2), [torch.zeros(1)]))
    True
    """
    if isinstance(ref, torch.Tensor):
        return isinstance(other, torch.Tensor) and torch.allclose(other, ref)
    if isinstance(ref, dict):
        if not isinstance(other, dict) or ref.keys() != other.keys():
            return False
        return all(allclose(value, other[key]) for key, value in ref.items())
    if isinstance(ref, (tuple, list)):
        container = tuple if isinstance(ref, tuple) else list
        if not isinstance(other, container) or len(ref) != len(other):
            return False
        return all(allclose(r, o) for r, o in zip(ref, other))
    raise TypeError(
        f"poptorch.testing.allclose compares tensors and tuples/lists/dicts of them; "
        f"got {type(ref).__name__}"
    )
