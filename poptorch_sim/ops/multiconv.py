"""``MultiConv``: the scope whose data-independent convolutions PopLibs plans as one.

Numerically the convolutions run as written. The simulator keeps PopTorch's option validation
and counts the convolutions run inside the scope (a ``TorchFunctionMode``), so that an empty or
nested scope, or per-convolution options of the wrong length, fail as they do on an IPU.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..enums import MultiConvPlanType
from ..errors import createPoptorchError

__all__ = ["MultiConv"]

_CONVOLUTIONS = frozenset(
    {
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.conv_transpose3d,
        torch.convolution,
    }
)
_active = threading.local()


class _ConvolutionCounter(TorchFunctionMode):
    """Counts the convolutions called while it is the active torch-function mode."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        if func in _CONVOLUTIONS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _per_conv(name: str, value: Any, scalar_type: type) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, scalar_type):
        return (value,)
    if (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(v, scalar_type) for v in value)
    ):
        return tuple(value)
    raise AssertionError(f"Invalid {name}!")


def _partials_code(dtype: Any) -> int:
    if dtype in (torch.float, torch.float32):
        return 0
    if dtype in (torch.half, torch.float16):
        return 1
    raise ValueError("Invalid partials types. Expecting torch.float or torch.half")


class MultiConv:
    """Combine the convolutions run inside this scope into one multi-convolution.

    The setters return ``self`` so they chain. Per-convolution options take one value (used for
    every convolution) or a list with one value per convolution, in call order.

    >>> conv = torch.nn.Conv2d(1, 1, 1)
    >>> with MultiConv().planType(MultiConvPlanType.Parallel):
    ...     y = conv(torch.ones(1, 1, 2, 2))
    """

    def __init__(self) -> None:
        """Start with every option unset (PopLibs' defaults)."""
        self._available_memory_proportions: tuple[float, ...] | None = None
        self._partials_types: tuple[int, ...] | None = None
        self._enable_conv_ditherings: tuple[bool, ...] | None = None
        self._plan_type: MultiConvPlanType | None = None
        self._per_conv_reserved_tiles: int | None = None
        self._cycle_back_off: float | None = None
        self._counter: _ConvolutionCounter | None = None

    def availableMemoryProportions(self, value: float | Sequence[float]) -> MultiConv:
        """Set the available memory proportion of each convolution (each in [0, 1)).

        Raises: AssertionError: not a float or a non-empty list of floats.
        """
        self._available_memory_proportions = _per_conv("available memory proportion", value, float)
        return self

    def partialsTypes(self, value: torch.dtype | Sequence[torch.dtype]) -> MultiConv:
        """Set the partials type (``torch.float`` or ``torch.half``) of each convolution.

        Raises: ValueError: another type ("Invalid partials types. ...").
        """
        values = value if isinstance(value, (list, tuple)) else [value]
        self._partials_types = tuple(_partials_code(v) for v in values)
        return self

    def enableConvDithering(self, value: bool | Sequence[bool] | None) -> MultiConv:
        """Enable convolution dithering, for all or for each convolution.

        Raises: ValueError: not a bool or a list of bools.
        """
        if value is None:
            self._enable_conv_ditherings = None
        elif isinstance(value, bool):
            self._enable_conv_ditherings = (value,)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
            self._enable_conv_ditherings = tuple(value)
        else:
            raise ValueError("value must be bool or list of bools")
        return self

    def planType(self, value: MultiConvPlanType | None) -> MultiConv:
        """Plan the convolutions in parallel or serially (``poptorch.MultiConvPlanType``).

        Raises: AssertionError: not a ``MultiConvPlanType`` ("Invalid plan type!").
        """
        if value is not None and not isinstance(value, MultiConvPlanType):
            raise AssertionError("Invalid plan type!")
        self._plan_type = value
        return self

    def perConvReservedTiles(self, value: int) -> MultiConv:
        """Set the number of tiles reserved for each convolution.

        Raises: AssertionError: not an int.
        """
        if not isinstance(value, int):
            raise AssertionError(f"perConvReservedTiles expects an int; got {value!r}")
        self._per_conv_reserved_tiles = value
        return self

    def cycleBackOff(self, value: float) -> MultiConv:
        """Set the cycle back-off proportion (between 0 and 1).

        Raises: AssertionError: not a float.
        """
        if not isinstance(value, float):
            raise AssertionError(f"cycleBackOff expects a float; got {value!r}")
        self._cycle_back_off = value
        return self

    def __enter__(self) -> MultiConv:
        if getattr(_active, "scope", None) is not None:
            raise createPoptorchError("Nested poptorch.MultiConv is not supported.")
        self._counter = _ConvolutionCounter()
        self._counter.__enter__()
        _active.scope = self
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        counter, self._counter = self._counter, None
        _active.scope = None
        if counter is None:
            return
        counter.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self._check_convolutions(counter.count)

    def _check_convolutions(self, count: int) -> None:
        if count == 0:
            raise createPoptorchError(
                "Unexpected end_multi_conv: no convolution ran inside this poptorch.MultiConv. "
                "Put at least one convolution in the scope or remove it."
            )
        per_conv = {
            "availableMemoryProportions": self._available_memory_proportions,
            "partialsTypes": self._partials_types,
            "enableConvDithering": self._enable_conv_ditherings,
        }
        for name, values in per_conv.items():
            if values is not None and len(values) not in (1, count):
                raise createPoptorchError(
                    f"poptorch.MultiConv.{name} got {len(values)} values but the scope ran "
                    f"{count} convolutions; give one value, or one per convolution."
                )
