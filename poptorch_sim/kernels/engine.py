"""Python view of the C++ tile engine: the simulated tile count and per-kernel counters.

The engine (``csrc/engine/tile_engine.h``, see its ``[Note: tile engine]``) runs each kernel as
supersteps of per-tile compute followed by an exchange, and counts per kernel name:

    counter            meaning
    calls              kernel invocations
    supersteps         compute+exchange phases run
    compare_exchanges  comparisons of a sorting network or merge
    flops              arithmetic operations (NMS: 12 per IoU evaluated)
    bytes_exchanged    bytes moved between tiles in exchange phases
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple

import torch

__all__ = [
    "KernelCounters",
    "counters",
    "load_library",
    "num_tiles",
    "reset_counters",
    "set_num_tiles",
    "set_simd_choice",
    "set_simd_level",
    "set_stream_mid_rows",
    "simd",
    "simd_families",
    "simd_family_level",
    "simd_family_runs",
    "simd_level",
    "stream_mid_rows",
    "supported_simd_level",
    "tiles",
    "uncounted",
]

SIMD_LEVELS = ("base", "avx2", "avx512")


def load_library() -> None:
    """Loads ``poptorch_sim._C`` into ``torch.ops.poptorch_sim`` once; idempotent.

    Raises:
        ImportError: the extension has not been built.
    """
    if hasattr(torch.ops.poptorch_sim, "engine_counters"):
        return
    spec = importlib.util.find_spec("poptorch_sim._C")
    if spec is None or spec.origin is None:
        raise ImportError(
            "poptorch_sim's C++ kernels are not built: run "
            "`python setup.py build_ext --inplace` in the project root"
        )
    torch.ops.load_library(spec.origin)


class KernelCounters(NamedTuple):
    """What the tile engine counted for one kernel since the last reset."""

    calls: int
    supersteps: int
    compare_exchanges: int
    flops: int
    bytes_exchanged: int


def _table() -> dict[str, tuple[int, ...]]:
    """The C++ engine's counter table, uncorrected."""
    kernels, fields, table = torch.ops.poptorch_sim.engine_counters()
    if list(fields) != list(KernelCounters._fields):
        raise RuntimeError(
            f"tile engine counter fields {list(fields)} do not match the Python view "
            f"{list(KernelCounters._fields)}; rebuild poptorch_sim._C"
        )
    return {name: tuple(row) for name, row in zip(kernels, table.tolist())}


# Counts of the kernels run inside `uncounted()` blocks since the last reset, left out of
# counters(); guarded by _uncounted_lock.
_uncounted: dict[str, list[int]] = {}
_uncounted_lock = threading.Lock()


def counters() -> dict[str, KernelCounters]:
    """Returns the engine's counters per kernel name (``sort``, ``topk``, ``nms``, ...).

    Kernels run inside :func:`uncounted` blocks (the SIMD chooser's samples) are left out.

    Returns:
        A dict from kernel name to its :class:`KernelCounters`; kernels not run since the
        last :func:`reset_counters` are absent.

    >>> reset_counters(); _ = torch.ops.poptorch_sim.sort(torch.randn(8))
    >>> counters()["sort"].calls
    1
    """
    with _uncounted_lock:
        table = _table()
        for name, hidden in _uncounted.items():
            if name in table:
                table[name] = tuple(a - b for a, b in zip(table[name], hidden))
    return {name: KernelCounters(*row) for name, row in table.items() if row[0] > 0}


def reset_counters() -> None:
    """Zeroes every kernel's counters."""
    with _uncounted_lock:
        torch.ops.poptorch_sim.engine_reset_counters()
        _uncounted.clear()


@contextmanager
def uncounted() -> Iterator[None]:
    """Leaves the kernels run in the enclosed block out of :func:`counters`.

    The block's counts are taken as the table's growth over it, so kernels that other threads
    run at the same time are left out too.
    """
    before = _table()
    try:
        yield
    finally:
        with _uncounted_lock:  # (a reset inside the block may leave some of it counted)
            for name, row in _table().items():
                grown = [max(0, a - b) for a, b in zip(row, before.get(name, (0,) * len(row)))]
                hidden = _uncounted.setdefault(name, [0] * len(row))
                _uncounted[name] = [h + g for h, g in zip(hidden, grown)]


def num_tiles() -> int:
    """Returns the simulated tile count kernels split their work over.

    The default is one tile per host intra-op thread (``torch.get_num_threads()``).
    """
    return int(torch.ops.poptorch_sim.engine_num_tiles())


def set_num_tiles(count: int) -> int:
    """Sets the simulated tile count; ``0`` restores the default (one per host thread).

    Args:
        count: tiles to split kernels over; more tiles than threads run in turns.

    Returns:
        The previous setting (``0`` when it was the default).

    Raises:
        ValueError: ``count`` is negative or not an int.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(
            f"the tile count must be a non-negative int (0 restores the default), got {count!r}"
        )
    return int(torch.ops.poptorch_sim.engine_set_num_tiles(count))


@contextmanager
def _setting(setter: Callable[[Any], Any], value: Any) -> Iterator[None]:
    """Calls ``setter(value)`` for the enclosed block, then puts back what it returned."""
    previous = setter(value)
    try:
        yield
    finally:
        setter(previous)


def tiles(count: int) -> AbstractContextManager[None]:
    """Runs the enclosed kernels over ``count`` simulated tiles, then restores the setting.

    Args:
        count: the tile count inside the block (``0``: the default).

    >>> with tiles(1472):  # one Mk2 IPU's worth of tiles
    ...     values, indices = torch.ops.poptorch_sim.sort(torch.randn(10_000))
    """
    return _setting(set_num_tiles, count)


def simd_level() -> str:
    """Returns the widest SIMD variant the C++ loops may run now: ``base``, ``avx2`` or ``avx512``.

    The default is the best this CPU supports, capped by the environment variable
    ``POPTORCH_SIM_SIMD``; each kernel family runs the variant measured fastest under it
    (:mod:`.simd_choice`) unless :func:`set_simd_level` pinned one. Every variant gives the same
    bits (``[Note: SIMD variants]``).
    """
    return str(torch.ops.poptorch_sim.engine_simd_level())


def supported_simd_level() -> str:
    """Returns the best SIMD variant this CPU can run."""
    return str(torch.ops.poptorch_sim.engine_supported_simd_level())


def set_simd_level(level: str) -> str:
    """Pins every kernel family at the SIMD variant ``level``, clamped to what this CPU supports.

    Args:
        level: ``base``, ``avx2`` or ``avx512``; or ``auto``: back to each family's measured
            choice (:mod:`.simd_choice`) under ``POPTORCH_SIM_SIMD``'s cap.

    Returns:
        The previous setting (``auto`` or a level).

    Raises:
        ValueError: ``level`` is not one of those names.
    """
    if level not in (*SIMD_LEVELS, "auto"):
        raise ValueError(
            f"unknown SIMD level {level!r}; use one of {', '.join(SIMD_LEVELS)} or auto"
        )
    return str(torch.ops.poptorch_sim.engine_set_simd_level(level))


def simd_families() -> list[str]:
    """Returns the kernel families that run their measured SIMD variant.

    The row sorts by length class and key width (``sort_rows_16_16bit``, ...,
    ``sort_rows_32768_64bit``), the long-row sorts (``sort_long_16bit``, ``sort_long_32bit``),
    ``nms``, ``accumulate`` and ``optimizer``.
    """
    return [str(name) for name in torch.ops.poptorch_sim.engine_simd_families()]


def simd_family_level(family: str) -> str:
    """Returns the SIMD variant ``family`` runs now (its measured choice under the cap)."""
    return str(torch.ops.poptorch_sim.engine_simd_family_level(family))


def simd_family_runs(family: str) -> dict[str, int]:
    """Returns how many kernel calls ran each SIMD variant of ``family`` in this process.

    Counted by the sorts (each call of the row sorts, each call of the long-row sorts), the
    chooser's samples included.

    >>> before = simd_family_runs("sort_rows_256_32bit")
    >>> _ = torch.ops.poptorch_sim.sort(torch.randn(4, 100))
    >>> level = simd_family_level("sort_rows_256_32bit")
    >>> simd_family_runs("sort_rows_256_32bit")[level] - before[level]
    1
    """
    counts = torch.ops.poptorch_sim.engine_simd_family_runs(family)
    return dict(zip(SIMD_LEVELS, (int(count) for count in counts), strict=True))


def set_simd_choice(family: str, level: str) -> str:
    """Sets ``family``'s measured SIMD variant (``""``: none) and returns the previous one."""
    return str(torch.ops.poptorch_sim.engine_set_simd_choice(family, level))


def stream_mid_rows() -> bool:
    """Returns whether the row sorts write rows of 17 to 1023 items with streaming stores.

    Rows of 16 items and of 1024 or more always stream (when a tile writes at least 2^16 items);
    for the rows between, :mod:`.simd_choice` measures which way is faster on this CPU
    (``[Note: streaming stores]`` in ``csrc/sort/bitonic/rows.h``). Both give the same bits.
    """
    return bool(torch.ops.poptorch_sim.sort_stream_mid_rows())


def set_stream_mid_rows(stream: bool) -> bool:
    """Sets whether the row sorts write rows of 17 to 1023 items with streaming stores (see
    :func:`stream_mid_rows`) and returns the previous setting. The measured choice replaces it
    when it is made (the first sort of such rows in the process, unless already made)."""
    return bool(torch.ops.poptorch_sim.sort_set_stream_mid_rows(stream))


def simd(level: str) -> AbstractContextManager[None]:
    """Runs the enclosed kernels with every family pinned at ``level``, then restores the setting.

    >>> with simd("base"):  # the loops a CPU without AVX2 runs
    ...     values, indices = torch.ops.poptorch_sim.sort(torch.randn(10_000))
    """
    return _setting(set_simd_level, level)


load_library()
