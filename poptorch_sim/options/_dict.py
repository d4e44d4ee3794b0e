"""``OptionsDict``: a dictionary of declared options, readable as attributes, that can be frozen."""

from __future__ import annotations

import copy
from typing import Any

from ..logger import debug_once

__all__ = ["OptionsDict", "no_effect"]


def no_effect(name: str) -> None:
    """Say once, at debug level, that option ``name`` is stored but changes nothing here."""
    debug_once(f"poptorch.Options: {name} is stored but has no effect in simulation")


class OptionsDict:
    """Options declared with defaults at construction; only declared keys may be ``set``.

    Values read as attributes (``opts.device_iterations``); public attribute assignment routes
    through ``set``. Once frozen (passed to a model or a loader) every change raises
    ``AttributeError("Can't modify frozen Options")``, as in PopTorch.
    """

    def __init__(self, **defaults: Any) -> None:
        object.__setattr__(self, "_is_frozen", False)
        object.__setattr__(self, "_values", dict(defaults))

    # -- PopTorch's dictionary API ------------------------------------------------------------
    def set(self, **kwargs: Any) -> None:
        """Change declared options; the new value must have the declared value's type."""
        self.checkIsFrozen()
        for name, value in kwargs.items():
            if name not in self._values:
                raise AssertionError(
                    f"Invalid option {name}, valid options are {list(self._values)}"
                )
            expected = type(self._values[name])
            if not isinstance(value, expected):
                raise AssertionError(
                    f"Unexpected type {type(value)} for option {name}. Expected {expected}"
                )
            self._values[name] = value

    def createOrSet(self, **kwargs: Any) -> None:
        """Set options, declaring the ones that do not exist yet."""
        self.checkIsFrozen()
        for name, value in kwargs.items():
            if name in self._values:
                self.set(**{name: value})
            else:
                self._values[name] = value

    def exists(self, option: str) -> bool:
        """Whether ``option`` is declared."""
        return option in self._values

    def deleteIfExists(self, option: str) -> None:
        """Remove ``option`` if declared."""
        self.checkIsFrozen()
        self._values.pop(option, None)

    def checkIsFrozen(self, option: str | None = None) -> None:
        """Raise ``AttributeError`` if these options are frozen."""
        if self._is_frozen:
            raise AttributeError("Can't modify frozen Options")

    def toDict(self) -> dict[str, Any]:
        """A plain copy of the declared values."""
        return dict(self._values)

    def update(self, other: dict[str, Any]) -> dict[str, Any]:
        """Merge the declared values into ``other`` (keys must not collide) and return it."""
        common = set(self._values).intersection(other)
        if common:
            raise AssertionError(f"Can't merge dictionaries, they have keys in common: {common}")
        other.update(self._values)
        return other

    # -- freezing and copying -------------------------------------------------------------------
    def _groups(self) -> list[OptionsDict]:
        return [v for v in vars(self).values() if isinstance(v, OptionsDict)]

    def _set_frozen(self, frozen: bool) -> None:
        object.__setattr__(self, "_is_frozen", frozen)
        for group in self._groups():
            group._set_frozen(frozen)

    def _freeze(self) -> None:
        self._set_frozen(True)

    def _unfreeze(self) -> None:
        self._set_frozen(False)

    def __deepcopy__(self, memo: dict[int, Any]) -> OptionsDict:
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        for key, value in vars(self).items():
            object.__setattr__(clone, key, copy.deepcopy(value, memo))
        clone._set_frozen(False)
        return clone

    def __getstate__(self) -> dict[str, Any]:
        return dict(vars(self))

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    # -- attribute access -----------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(f"Invalid attribute {name}.")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            if name != "_is_frozen":
                self.checkIsFrozen()
            object.__setattr__(self, name, value)
        else:
            self.set(**{name: value})

    def __call__(self, option: str) -> Any:
        return getattr(self, option)

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"{type(self).__name__}({items})"
