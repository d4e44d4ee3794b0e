"""Runs each kernel family in the SIMD variant measured fastest on this CPU.

The widest variant is not always the fastest (``[Note: measured variants]`` in ``csrc/common/simd.h``),
so the first time a kernel family runs in a process (a sort of one row length class and key
width, NMS, accumulation, an optimizer step: see :func:`first_use`), :func:`ensure` times every
variant ``POPTORCH_SIM_SIMD`` allows on a small sample, one tile, and keeps the fastest. The
times are cached per CPU model and build of the extension in
``$XDG_CACHE_HOME/poptorch_sim/simd_choice.json`` (``~/.cache`` by default), one entry per
family, so a family is measured once per machine:
importing poptorch_sim only reads the choices the file holds (:func:`load`) and measures
nothing. The op wrappers of :mod:`.sorting` and :mod:`.optim` call :func:`first_use`; a kernel
called through ``torch.ops.poptorch_sim`` directly runs the cached choice, else the widest
variant under the cap, until its family is first used through a wrapper. Top-k has no choice:
its per-tile selection and merges are scalar code, compiled once. ``POPTORCH_SIM_SIMD_MEASURE=0``
turns choosing off: every family then runs the widest variant under the cap.
:func:`simd_report` measures what is still unmeasured and shows the CPU, each variant's time
and the choice. The samples' kernels are left out of :func:`.engine.counters`.

The same way, the first sort of rows of 17 to 1023 items times whether their outputs are
written with streaming stores or ordinary ones (:func:`choose_stores`; ``[Note: streaming
stores]`` in ``csrc/sort/bitonic/rows.h``): which is faster depends on the machine's memory, not
on its SIMD level. Its two times are cached beside the families' as ``sort_stores``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .. import env
from ..logger import logger
from . import engine
from .simd_samples import SAMPLES

try:
    import fcntl
except ImportError:  # not POSIX: the cache is still replaced atomically, merges may race
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "cache_file",
    "choose",
    "choose_stores",
    "cpu_model",
    "ensure",
    "first_use",
    "load",
    "measure",
    "measure_stores",
    "settled",
    "simd_report",
    "sort_family",
]

# 3: a row length class of up to 1024 items (sort_rows_1024_32bit, ...) between 256 and 4096;
# 2: the sorts' families by key width (sort_rows_256_16bit, ...), where 1 had one per row
# length class (sort_rows_256, ...), timed on float32 for every width.
_VERSION = 3
Timer = Callable[[str, str], float]

# The cache entry of the stores' choice for rows of 17 to 1023 items, and its two modes.
STORES = "sort_stores"
STORE_MODES = ("plain", "stream")
# The row sort families whose rows include such lengths.
_MID_ROW_FAMILIES = ("sort_rows_256_", "sort_rows_1024_")


def cache_file() -> Path:
    """Returns the cache's path: ``$XDG_CACHE_HOME/poptorch_sim/simd_choice.json``."""
    return Path(env.user_cache_root()) / "poptorch_sim" / "simd_choice.json"


def cpu_model() -> str:
    """Returns this CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _build() -> str:
    spec = importlib.util.find_spec("poptorch_sim._C")
    if spec is None or spec.origin is None:
        return "unbuilt"
    stat = os.stat(spec.origin)
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def _key() -> str:
    return f"{cpu_model()} | {engine.supported_simd_level()} | build {_build()}"


def measure(family: str, level: str, repeats: int = 5) -> float:
    """Returns the best of ``repeats`` times (seconds) of ``family``'s sample in ``level``.

    The sample's kernels are left out of :func:`.engine.counters`.
    """
    run = SAMPLES[family]()
    previous = engine.set_simd_choice(family, level)
    try:
        with engine.uncounted(), engine.tiles(1):
            run()  # warm-up: page faults, first-touch of the outputs
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - start)
    finally:
        engine.set_simd_choice(family, previous)
    return best


def measure_stores(mode: str, repeats: int = 3) -> float:
    """Returns the best of ``repeats`` times (seconds) of a sort of 4096 float32 rows of 256
    (2^20 items) on every tile, its outputs written in ``mode`` (``plain`` or ``stream``) to
    memory out of cache.

    A sort's outputs are usually cold: other work ran since their memory was last written (the
    benchmark's reference sorts; a model's other layers). So a 32 MiB buffer is written before
    each timed call, which also evicts the 12 MiB of outputs the call before wrote; and the
    tiles all write at once, as they do in use, sharing the memory's bandwidth. Both modes take
    about 90 ms on dev-xeon. The sample's kernels are left out of :func:`.engine.counters`.
    """
    if mode not in STORE_MODES:
        raise ValueError(f"unknown store mode {mode!r}; use one of {', '.join(STORE_MODES)}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 256, generator=g, dtype=torch.float32, device="cpu")
    evict = torch.empty(1 << 23, dtype=torch.float32, device="cpu")
    previous = engine.set_stream_mid_rows(mode == "stream")
    try:
        with engine.uncounted():
            torch.ops.poptorch_sim.sort(x)  # warm-up: first touch of the outputs
            best = float("inf")
            for _ in range(repeats):
                evict.fill_(1.0)
                start = time.perf_counter()
                torch.ops.poptorch_sim.sort(x)
                best = min(best, time.perf_counter() - start)
    finally:
        engine.set_stream_mid_rows(previous)
    return best


def _read(path: Path) -> dict[str, Any]:
    """The cache's entries, or none when the file is missing, unreadable or not ours."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``path``'s lock file (between processes) where it can."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _merge(path: Path, key: str, times: dict[str, dict[str, float]]) -> None:
    """Adds ``times`` (family -> level -> seconds) to ``key``'s entry of the cache file.

    The file is read again under the lock and replaced atomically, so the entries and families
    other processes wrote meanwhile stay; a cache that cannot be written is left alone.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):
            entries = _read(path)
            entry = entries.get(key)
            entry = entry if isinstance(entry, dict) else {}
            for family, new in times.items():
                entry[family] = {**_valid_times(entry.get(family), _modes(family)), **new}
            entries[key] = entry
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".simd_choice.")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    json.dump({"version": _VERSION, "entries": entries}, out, indent=1,
                              sort_keys=True)  # fmt: skip
                os.replace(temp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
    except OSError:
        pass


def _valid_times(times: object, levels: tuple[str, ...]) -> dict[str, float]:
    if not isinstance(times, dict):
        return {}
    return {
        level: float(t)
        for level, t in times.items()
        if level in levels and isinstance(t, (int, float)) and t > 0
    }


def _modes(family: str) -> tuple[str, ...]:
    """What a cache entry times: the stores' modes, or a family's SIMD levels."""
    return STORE_MODES if family == STORES else engine.SIMD_LEVELS


def _fastest(times: dict[str, float], levels: tuple[str, ...]) -> str:
    """The fastest of ``levels``; on a tie the wider variant."""
    order = engine.SIMD_LEVELS
    return min(levels, key=lambda level: (times[level], -order.index(level)))


def _cap_levels() -> tuple[str, ...]:
    """The variants up to the cap (``POPTORCH_SIM_SIMD``, else what the CPU supports)."""
    pinned = engine.set_simd_level("auto")
    try:
        cap = engine.simd_level()
    finally:
        engine.set_simd_level(pinned)
    return engine.SIMD_LEVELS[: engine.SIMD_LEVELS.index(cap) + 1]


def choose(
    timer: Timer | None = None,
    levels: tuple[str, ...] | None = None,
    path: Path | None = None,
    key: str | None = None,
    families: Iterable[str] | None = None,
) -> dict[str, str]:
    """Sets each family's SIMD variant to the fastest of ``levels`` and returns the choices.

    Times come from the cache where it has them for this CPU and build, else from ``timer``
    (default :func:`measure`), and new ones are merged into the cache.

    Args:
        timer: ``timer(family, level)`` -> seconds; tests inject fixed times.
        levels: the variants to compare (default: those up to ``POPTORCH_SIM_SIMD``'s cap).
        path: the cache file (default :func:`cache_file`).
        key: the cache entry (default: CPU model, supported level and build).
        families: the families to choose for (default: all of them).
    """
    timer = timer or measure
    levels = levels or _cap_levels()
    path = path or cache_file()
    key = key or _key()
    entry = _read(path).get(key)
    entry = entry if isinstance(entry, dict) else {}
    new: dict[str, dict[str, float]] = {}
    choices: dict[str, str] = {}
    pinned = engine.set_simd_level("auto")  # (measuring needs the choices to count)
    try:
        for family in engine.simd_families() if families is None else families:
            times = _valid_times(entry.get(family), engine.SIMD_LEVELS)
            for level in levels:
                if level not in times:
                    times[level] = new.setdefault(family, {})[level] = float(timer(family, level))
            choices[family] = _fastest(times, levels)
            engine.set_simd_choice(family, choices[family])
    finally:
        engine.set_simd_level(pinned)
        if new:
            _merge(path, key, new)
    return choices


def _set_stores(times: dict[str, float]) -> str:
    """Sets the faster of the store modes (on a tie ordinary stores) and returns it."""
    choice = min(STORE_MODES, key=lambda mode: (times[mode], STORE_MODES.index(mode)))
    engine.set_stream_mid_rows(choice == "stream")
    return choice


def choose_stores(
    timer: Callable[[str], float] | None = None, path: Path | None = None, key: str | None = None
) -> str:
    """Sets whether rows of 17 to 1023 items are written with streaming stores, by the faster of
    the two on this machine (a tie: ordinary stores), and returns the choice.

    Times come from the cache where it has them for this CPU and build, else from ``timer``
    (default :func:`measure_stores`), and new ones are merged into the cache.

    Args:
        timer: ``timer(mode)`` -> seconds, ``mode`` one of ``plain`` and ``stream``; tests
            inject fixed times.
        path: the cache file (default :func:`cache_file`).
        key: the cache entry (default: CPU model, supported level and build).
    """
    timer = timer or measure_stores
    path = path or cache_file()
    key = key or _key()
    entry = _read(path).get(key)
    times = _valid_times(entry.get(STORES) if isinstance(entry, dict) else None, STORE_MODES)
    new = {mode: float(timer(mode)) for mode in STORE_MODES if mode not in times}
    times.update(new)
    choice = _set_stores(times)
    if new:
        _merge(path, key, {STORES: new})
    return choice


# The families whose choice this process has made (measured, read from the cache, or left to
# the cap because choosing is off); _lock guards the changes, _busy marks the chooser's own
# samples running (their wrappers must not start choosing again).
_settled: set[str] = set()
_lock = threading.RLock()
_busy = False


def settled() -> frozenset[str]:
    """Returns the families whose variant this process has chosen so far."""
    return frozenset(_settled)


def load(path: Path | None = None) -> list[str]:
    """Sets the choices the cache holds for every family it has times for; measures nothing.

    A family counts when the cache times every variant under the cap, the stores' choice
    (:data:`STORES`) when it times both modes. Returns those families.
    """
    if not env.simd_measure():
        return []
    with _lock:
        levels = _cap_levels()
        entry = _read(path or cache_file()).get(_key())
        entry = entry if isinstance(entry, dict) else {}
        done = []
        for family in engine.simd_families():
            times = _valid_times(entry.get(family), engine.SIMD_LEVELS)
            if family not in _settled and all(level in times for level in levels):
                engine.set_simd_choice(family, _fastest(times, levels))
                _settled.add(family)
                done.append(family)
        stores = _valid_times(entry.get(STORES), STORE_MODES)
        if STORES not in _settled and len(stores) == len(STORE_MODES):
            _set_stores(stores)
            _settled.add(STORES)
            done.append(STORES)
        return done


def ensure(*families: str) -> None:
    """Chooses each of ``families`` not chosen yet in this process (all with none named).

    Families the cache lacks are measured (:func:`choose`; :data:`STORES`, the stores' choice:
    :func:`choose_stores`) and merged into it. Other threads wait while a family is measured;
    the samples' own kernels do not choose again. A failure while measuring is logged as a
    warning and the families run the widest variant under the cap (rows of 17 to 1023 items
    ordinary stores).
    """
    global _busy
    wanted = families or (*engine.simd_families(), STORES)
    if _settled.issuperset(wanted):
        return
    with _lock:
        missing = [family for family in wanted if family not in _settled]
        if _busy or not missing:
            return
        if env.simd_measure():
            _busy = True
            start = time.perf_counter()
            try:
                kernel_families = [family for family in missing if family != STORES]
                choices = choose(measure, families=kernel_families) if kernel_families else {}
                if STORES in missing:
                    choices[STORES] = choose_stores()
                logger.debug(
                    "SIMD variants chosen in %.1f ms: %s", (time.perf_counter() - start) * 1e3,
                    ", ".join(f"{family} {level}" for family, level in choices.items()),
                )  # fmt: skip
            except Exception as error:  # the kernels still run: the widest variant under the cap
                logger.warning(
                    "choosing the SIMD variant of %s failed (%s: %s); running the widest "
                    "variant under the cap, %s", ", ".join(missing), type(error).__name__,
                    error, engine.simd_level(),
                )  # fmt: skip
            finally:
                _busy = False
        _settled.update(missing)


def _runs_kernels(tensors: tuple[Tensor, ...]) -> bool:
    """Whether a call with these operands runs the C++ kernels now: eager, real CPU tensors."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return False  # traced or under a mode (fake tensors, make_fx): nothing runs here
    return all(
        type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" for t in tensors
    )


def first_use(family: str | None, *tensors: Tensor) -> None:
    """Chooses ``family``'s variant before its first kernel runs in this process (:func:`ensure`),
    and for the row sorts of 17 to 1023 items (``sort_rows_256_*``, ``sort_rows_1024_*``) the
    stores' choice too (:func:`choose_stores`).

    Nothing is done once it is chosen, nor for calls that will not run the C++ kernels here
    (operands on CUDA, fake or traced tensors, ``torch.compile`` tracing).

    Args:
        family: one of :func:`.engine.simd_families`, or ``None`` for kernels without SIMD
            variants (:func:`sort_family` of long rows of 64-bit keys).
        tensors: the call's operands (one of each list is enough).
    """
    if family is None:
        return
    wanted = (family, STORES) if family.startswith(_MID_ROW_FAMILIES) else (family,)
    if _settled.issuperset(wanted) or not _runs_kernels(tensors):
        return
    ensure(*wanted)


def sort_family(input: Tensor, dim: int = -1) -> str | None:
    """Returns the family that sorts ``input`` along ``dim`` (``row_sort_family`` in
    ``csrc/sort/sort.h``), ``None`` where that sort has no SIMD variants.

    Rows of up to 2^15 items take the bitonic network, by row length class and key width (16,
    32 or 64 bits; 8-bit keys count as 32-bit ones); longer rows the long-row sorts
    (``sort_long_16bit``, ``sort_long_32bit``; those of 64-bit keys are scalar code: ``None``).
    A ``dim`` out of range counts as rows of one item.

    >>> sort_family(torch.zeros(3, 100, dtype=torch.float16))
    'sort_rows_256_16bit'
    """
    rank = input.dim()
    n = input.shape[dim] if rank and -rank <= dim < rank else 1
    bits = {2: 16, 8: 64}.get(input.element_size(), 32)
    for limit in (16, 256, 1024, 4096, 32768):
        if n <= limit:
            return f"sort_rows_{limit}_{bits}bit"
    return None if bits == 64 else f"sort_long_{bits}bit"


def simd_report(path: Path | None = None) -> str:
    """Returns the CPU, the cap, each family's variant times (ms) from the cache and its choice.

    Families not chosen yet are chosen first (measured where the cache lacks them).

    Args:
        path: the cache file to read the times from (default :func:`cache_file`; another file
            is only read).

    >>> print(simd_report())  # doctest: +SKIP
    CPU: Intel(R) Xeon(R) Processor (16 cores), supports avx512, cap avx512
    family                    base     avx2   avx512  runs
    sort_rows_16_16bit       0.152    0.095    0.087  avx512
    ...
    stores of rows of 17-1023 items (ms): plain 2.285, stream 1.829; runs stream
    """
    if path is None:
        ensure()
    entries = _read(path or cache_file())
    entry = entries.get(_key())
    entry = entry if isinstance(entry, dict) else {}
    lines = [
        f"CPU: {cpu_model()} ({os.cpu_count()} cores), supports {engine.supported_simd_level()}, "
        f"cap {engine.simd_level()}",
        f"{'family':<21} " + " ".join(f"{lv:>8}" for lv in engine.SIMD_LEVELS) + "  runs",
    ]
    levels = engine.SIMD_LEVELS
    for family in engine.simd_families():
        times = _valid_times(entry.get(family), levels)
        cells = " ".join(
            f"{times[lv] * 1e3:8.3f}" if lv in times else f"{'-':>8}" for lv in levels
        )
        lines.append(f"{family:<21} {cells}  {engine.simd_family_level(family)}")
    stores = _valid_times(entry.get(STORES), STORE_MODES)
    cells = ", ".join(
        f"{mode} {stores[mode] * 1e3:.3f}" if mode in stores else f"{mode} -"
        for mode in STORE_MODES
    )
    mode = "stream" if engine.stream_mid_rows() else "plain"
    lines.append(f"stores of rows of 17-1023 items (ms): {cells}; runs {mode}")
    return "\n".join(lines)
