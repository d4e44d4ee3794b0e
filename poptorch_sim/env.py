"""Every environment variable poptorch_sim reads, each behind one typed getter."""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = [
    "cache_dir",
    "default_options_json",
    "dist_timeout",
    "engine_options",
    "log_level",
    "num_ipus",
    "offline",
    "threads_per_ipu",
    "ipu_model",
    "ipu_memory",
    "ipu_version",
    "out_of_memory",
    "simd_measure",
    "user_cache_root",
    "wait_for_ipu",
    "sharding_config",
]

DEFAULT_NUM_IPUS = 64
MK2_IPU_MEMORY = 1472 * 624 * 1024  # tiles × In-Processor Memory per tile
_UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}  # fmt: skip


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def log_level() -> str:
    """``POPTORCH_LOG_LEVEL``: initial log level (default ``WARN``)."""
    return _get("POPTORCH_LOG_LEVEL") or "WARN"


def num_ipus() -> int:
    """``POPTORCH_SIM_NUM_IPUS``: how many simulated Mk2 IPUs the machine reports.

    Defaults to 64 (one IPU-POD64), so libraries that probe for hardware take their IPU
    paths. Set it to 0 to make ``ipuHardwareIsAvailable()`` report no hardware, as PopTorch's own
    test suite expects on a machine without IPUs.
    """
    raw = _get("POPTORCH_SIM_NUM_IPUS")
    if raw is None:
        return DEFAULT_NUM_IPUS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"POPTORCH_SIM_NUM_IPUS must be a non-negative integer, got {raw!r}"
        ) from None
    if value < 0:
        raise ValueError(f"POPTORCH_SIM_NUM_IPUS must be a non-negative integer, got {value}")
    return value


def threads_per_ipu() -> int | None:
    """``POPTORCH_SIM_THREADS_PER_IPU``: intra-op threads of each IPU worker (default: shared)."""
    raw = _get("POPTORCH_SIM_THREADS_PER_IPU")
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"POPTORCH_SIM_THREADS_PER_IPU must be a positive integer, got {raw!r}")
    return int(raw)


def worker_memory() -> bool:
    """``POPTORCH_SIM_WORKER_MEMORY``: IPU worker threads take their large tensors from a pool
    kept mapped between steps (default on; ``0`` turns it off)."""
    return (_get("POPTORCH_SIM_WORKER_MEMORY") or "1") != "0"


def dist_timeout() -> float:
    """``POPTORCH_SIM_DIST_TIMEOUT``: seconds any wait on other processes may take (default 300).

    Bounds joining the process group, every gradient all-reduce and every barrier, so a peer
    that died or never started ends the run with an error instead of a hang.
    """
    raw = _get("POPTORCH_SIM_DIST_TIMEOUT")
    if raw is None:
        return 300.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(
            f"POPTORCH_SIM_DIST_TIMEOUT must be a positive number of seconds, got {raw!r}"
        )
    return value


def default_options_json() -> str | None:
    """``POPTORCH_DEFAULT_OPTIONS``: JSON applied to every new ``Options`` (``from_json``)."""
    return _get("POPTORCH_DEFAULT_OPTIONS")


def cache_dir() -> str | None:
    """``POPTORCH_CACHE_DIR``: equivalent of ``Options.enableExecutableCaching(path)``."""
    return _get("POPTORCH_CACHE_DIR")


def user_cache_root() -> str:
    """``XDG_CACHE_HOME``: the user's cache folder (default ``~/.cache``)."""
    return _get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def simd_measure() -> bool:
    """``POPTORCH_SIM_SIMD_MEASURE``: choose each kernel family's SIMD variant by measurement
    (default on; ``0`` turns it off)."""
    return (_get("POPTORCH_SIM_SIMD_MEASURE") or "1") != "0"


def ipu_model() -> bool:
    """``POPTORCH_IPU_MODEL``: whether the IPU Model was requested (no effect in simulation)."""
    return (_get("POPTORCH_IPU_MODEL") or "0") not in ("0", "false", "False")


def wait_for_ipu() -> bool:
    """``POPTORCH_WAIT_FOR_IPU``: wait for an IPU another process holds instead of failing."""
    return (_get("POPTORCH_WAIT_FOR_IPU") or "0") not in ("0", "false", "False")


def offline() -> bool:
    """``POPTORCH_SIM_OFFLINE``: never try the network (e.g. MNIST downloads); default off."""
    return (_get("POPTORCH_SIM_OFFLINE") or "0") not in ("0", "false", "False")


def sharding_config() -> str | None:
    """``POPTORCH_SIM_SHARDING_CONFIG``: PopRT manual sharding YAML for every compiled model.

    ``python -m poptorch_sim.shard --config shard.yaml script.py`` sets it.
    """
    return _get("POPTORCH_SIM_SHARDING_CONFIG")


def engine_options() -> dict[str, Any]:
    """``POPLAR_ENGINE_OPTIONS``: Poplar engine options as a dict (``{}`` when unset).

    Raises:
        ValueError: the variable is set but is not a JSON object.
    """
    raw = _get("POPLAR_ENGINE_OPTIONS")
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"POPLAR_ENGINE_OPTIONS is not valid JSON ({exc}): {raw!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"POPLAR_ENGINE_OPTIONS must be a JSON object, got {raw!r}")
    return value


def ipu_memory() -> int:
    """``POPTORCH_SIM_IPU_MEMORY``: memory of each simulated IPU in bytes (default a Mk2 IPU's).

    Bytes, or a number with a ``KB``/``MB``/``GB`` suffix (binary: ``1KB`` = 1024 bytes;
    ``KiB``/``MiB``/``GiB`` are accepted too). The default is 1472 tiles × 624 KiB
    (940,572,672 bytes).

    Raises:
        ValueError: not a positive size.
    """
    raw = _get("POPTORCH_SIM_IPU_MEMORY")
    if raw is None:
        return MK2_IPU_MEMORY
    text = raw.strip().upper().replace(" ", "")
    number = text.rstrip("KMGIB")
    unit = text[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        value = -1.0
    if not value >= 1:
        raise ValueError(
            f"POPTORCH_SIM_IPU_MEMORY must be a positive size in bytes, optionally with a "
            f"KB, MB or GB suffix (e.g. 900MB), got {raw!r}"
        )
    return int(value)


def ipu_version() -> int | None:
    """``POPTORCH_SIM_IPU_VERSION``: the IPU version attached runs are timed on (2 = Mk2,
    21 = Bow, as ``useOfflineIpuTarget`` numbers them); None when unset (Mk2).

    Raises:
        ValueError: not an integer (an unknown version is refused where it is used).
    """
    raw = _get("POPTORCH_SIM_IPU_VERSION")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"POPTORCH_SIM_IPU_VERSION must be an IPU version (2 for Mk2, 21 for Bow), got {raw!r}"
        ) from None


def out_of_memory() -> str:
    """``POPTORCH_SIM_OUT_OF_MEMORY``: what compiling a model that does not fit does.

    ``warn`` (default): log a warning and run anyway; ``error``: raise ``poptorch.Error``, as
    PopTorch does on an IPU (unless the engine option ``debug.allowOutOfMemory`` is set).

    Raises:
        ValueError: another value.
    """
    raw = (_get("POPTORCH_SIM_OUT_OF_MEMORY") or "warn").strip().lower()
    if raw not in ("warn", "error"):
        raise ValueError(
            f"POPTORCH_SIM_OUT_OF_MEMORY must be 'warn' or 'error', got "
            f"{_get('POPTORCH_SIM_OUT_OF_MEMORY')!r}"
        )
    return raw
