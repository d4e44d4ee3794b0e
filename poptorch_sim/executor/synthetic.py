"""Synthetic data (``Options.enableSyntheticData``, PopART's ``syntheticDataMode``).

With synthetic data an IPU does not stream the host's inputs in: each input stream is filled on
the device, with zeros or random values, in the shape and dtype of the host tensor. Here the
host tensors of each call are replaced by such tensors before the call runs, so the model never
reads the host's values:

    syntheticDataMode   0 Off   1 Zeros   2 RandomNormal   3 RandomUniform
    floating inputs     host    zeros     N(0, 1)          U(0, 1)
    other inputs        host    zeros     zeros            zeros

Integer and boolean inputs (labels, indices, masks) are zeros in every mode so that they stay
valid indices for any class count; a device would read whatever its fill left there.
"""

from __future__ import annotations

import torch

from .inputs import BoundArgs

__all__ = ["MODES", "SyntheticData", "synthetic_data"]

MODES = ("Off", "Zeros", "RandomNormal", "RandomUniform")


class SyntheticData:
    """Replaces a call's input tensors by device-generated ones (one random stream per model).

    Args:
        mode: PopART's ``SyntheticDataMode`` value (0 to 3).
        seed: seeds the random stream (the options' ``randomSeed``, else 0).

    Raises:
        ValueError: an unknown mode.

    >>> SyntheticData(1, 0).replace(torch.ones(2))
    tensor([0., 0.])
    """

    def __init__(self, mode: int, seed: int = 0) -> None:
        if not 0 <= int(mode) < len(MODES):
            raise ValueError(
                f"Unknown syntheticDataMode {mode!r}: expected 0 to 3 "
                f"({', '.join(f'{i} {m}' for i, m in enumerate(MODES))})"
            )
        self.mode = int(mode)
        self._rng = torch.Generator().manual_seed(seed)

    def __repr__(self) -> str:
        return f"SyntheticData({MODES[self.mode]})"

    def replace(self, host: torch.Tensor) -> torch.Tensor:
        """A tensor shaped and typed like ``host`` that does not depend on its values."""
        if self.mode == 0:
            return host
        floating = host.is_floating_point() or host.is_complex()
        if not floating or self.mode == 1:
            return torch.zeros(host.shape, dtype=host.dtype)
        values = torch.empty(host.shape, dtype=torch.float32)
        if self.mode == 2:
            values.normal_(generator=self._rng)
        else:
            values.uniform_(generator=self._rng)
        return values.to(host.dtype)

    def bind(self, bound: BoundArgs) -> BoundArgs:
        """The call ``bound`` with every input tensor replaced (see ``replace``)."""
        return bound if self.mode == 0 else bound.map_tensors(self.replace)


def synthetic_data(popart_options: dict[str, object], seed: int | None) -> SyntheticData | None:
    """The ``SyntheticData`` the options ask for, or None (host data, the default)."""
    mode = popart_options.get("syntheticDataMode", 0)
    if not mode:
        return None
    return SyntheticData(int(mode), seed or 0)  # type: ignore[call-overload]
