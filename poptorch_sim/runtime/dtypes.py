"""The dtypes an IPU holds: what an input becomes when it is loaded, and an output when stored.

An IPU has no float64 and returns int64 results as int32, so float64 inputs are loaded as
float32, and float64 / int64 outputs come back to the host as float32 / int32.
"""

from __future__ import annotations

import torch

__all__ = ["device_dtype", "host_dtype"]

_ON_DEVICE = {torch.float64: torch.float32}
_ON_HOST = {torch.float64: torch.float32, torch.int64: torch.int32}


def device_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an input has on the IPU (float64 → float32, others kept)."""
    return _ON_DEVICE.get(dtype, dtype)


def host_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an output comes back to the host with (int64 → int32, float64 → float32)."""
    return _ON_HOST.get(dtype, dtype)
