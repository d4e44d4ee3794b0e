"""``ParamStateDict``: an optimizer's per-parameter state that counts its own changes."""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["ParamStateDict"]


class ParamStateDict(dict[Tensor, dict[str, Any]]):
    """A dict from parameter to its state dict whose ``version`` grows on every change.

    ``FusedOptimizer`` keeps each group's list of state dicts between steps and rebuilds it
    only when ``version`` moved: finding 2,000 parameters' states by tensor hash every step
    costs about a millisecond. Entries changed inside a state dict (``state[p]["exp_avg"] =
    t``) need no version: the step reads them afresh from the kept dicts.

    >>> s = ParamStateDict(); before = s.version; s[object()] = {}; s.version > before
    True
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = 0

    def _changed(self) -> None:
        self.version += 1

    def __setitem__(self, key: Tensor, value: dict[str, Any]) -> None:
        self._changed()
        super().__setitem__(key, value)

    def __delitem__(self, key: Tensor) -> None:
        self._changed()
        super().__delitem__(key)

    def setdefault(self, key: Tensor, default: Any = None) -> Any:
        """``dict.setdefault``, counted as a change."""
        self._changed()
        return super().setdefault(key, default)

    def pop(self, *args: Any) -> Any:
        """``dict.pop``, counted as a change."""
        self._changed()
        return super().pop(*args)

    def popitem(self) -> tuple[Tensor, dict[str, Any]]:
        """``dict.popitem``, counted as a change."""
        self._changed()
        return super().popitem()

    def clear(self) -> None:
        """``dict.clear``, counted as a change."""
        self._changed()
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        """``dict.update``, counted as a change."""
        self._changed()
        super().update(*args, **kwargs)

    def __ior__(self, other: Any) -> ParamStateDict:
        self._changed()
        return super().__ior__(other)  # type: ignore[return-value]
