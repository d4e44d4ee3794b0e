"""Runs each kernel family in the SIMD variant measured fastest on this CPU.

The widest variant is not always the fastest (``[Note: measured variants]`` in ``csrc/common/simd.h``),
so the first time poptorch_sim's kernels load on a machine, :func:`choose` times every variant
``POPTORCH_SIM_SIMD`` allows for each kernel family on a small sample, one tile, and keeps the
fastest (0.1 s in all on a 16-core AVX-512 Xeon, 2026-11-25). The times are cached per CPU model
and build of the extension in ``$XDG_CACHE_HOME/poptorch_sim/simd_choice.json`` (``~/.cache`` by
default), so later imports only read the file (0.35 ms there). ``POPTORCH_SIM_SIMD_MEASURE=0`` turns measuring off: every
family then runs the widest variant under the cap. :func:`simd_report` shows the CPU, each
variant's time and the choice.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .. import env
from . import engine

__all__ = ["cache_file", "choose", "cpu_model", "measure", "simd_report"]

_VERSION = 1
# Each family's sample: a function that makes it and returns the call to time.
Sample = Callable[[], Callable[[], object]]
Timer = Callable[[str, str], float]


def _sort_sample(rows: int, length: int) -> Sample:
    def make() -> Callable[[], object]:
        x = torch.randn(rows, length, generator=torch.Generator().manual_seed(0))
        return lambda: torch.ops.poptorch_sim.sort(x)

    return make


def _nms_sample() -> Callable[[], object]:
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(1000, 2, generator=g) * 200
    boxes = torch.cat([xy, xy + torch.rand(1000, 2, generator=g) * 40 + 1], dim=1)
    scores = torch.rand(1000, generator=g)
    return lambda: torch.ops.poptorch_sim.nms(boxes, scores, 0.5)


def _accumulate_sample() -> Callable[[], object]:
    from .optim import accumulate_

    g = torch.Generator().manual_seed(0)
    accum = torch.randn(1 << 16, generator=g)
    grad = torch.randn(1 << 16, generator=g)
    return lambda: accumulate_(accum, grad, 0.5)


def _optimizer_sample() -> Callable[[], object]:
    from .optim import adam_step_

    g = torch.Generator().manual_seed(0)
    params, grads, m, v = ([torch.randn(1 << 14, generator=g)] for _ in range(4))
    v[0].abs_()
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    return lambda: adam_step_(params, grads, m, v, [1.0], decoupled_weight_decay=True, **hyper)


SAMPLES: dict[str, Sample] = {
    "sort_rows_16": _sort_sample(4096, 16),
    "sort_rows_256": _sort_sample(256, 256),
    "sort_rows_4096": _sort_sample(16, 4096),
    "sort_rows_32768": _sort_sample(2, 32768),
    "sort_long": _sort_sample(1, 1 << 17),
    "nms": _nms_sample,
    "accumulate": _accumulate_sample,
    "optimizer": _optimizer_sample,
}


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
    """Returns the best of ``repeats`` times (seconds) of ``family``'s sample in ``level``."""
    run = SAMPLES[family]()
    previous = engine.set_simd_choice(family, level)
    try:
        with engine.tiles(1):
            run()  # warm-up: page faults, first-touch of the outputs
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - start)
    finally:
        engine.set_simd_choice(family, previous)
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


def _write(path: Path, entries: dict[str, Any]) -> None:
    """Writes the cache atomically; a cache that cannot be written is left alone."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".simd_choice.")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"version": _VERSION, "entries": entries}, out, indent=1, sort_keys=True)
        os.replace(temp, path)
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


def choose(
    timer: Timer | None = None,
    levels: tuple[str, ...] | None = None,
    path: Path | None = None,
    key: str | None = None,
) -> dict[str, str]:
    """Sets every family's SIMD variant to the fastest of ``levels`` and returns the choices.

    Times come from the cache where it has them for this CPU and build, else from ``timer``
    (default :func:`measure`), and new ones are written back.

    Args:
        timer: ``timer(family, level)`` -> seconds; tests inject fixed times.
        levels: the variants to compare (default: those up to ``POPTORCH_SIM_SIMD``'s cap).
        path: the cache file (default :func:`cache_file`).
        key: the cache entry (default: CPU model, supported level and build).
    """
    timer = timer or measure
    all_levels = engine.SIMD_LEVELS
    pinned = engine.set_simd_level("auto")  # (measuring needs the choices to count)
    try:
        if levels is None:
            cap = engine.simd_level()
            levels = all_levels[: all_levels.index(cap) + 1]
        path = path or cache_file()
        key = key or _key()
        entries = _read(path)
        entry = entries.get(key)
        entry = entry if isinstance(entry, dict) else {}
        changed = False
        choices: dict[str, str] = {}
        for family in engine.simd_families():
            times = _valid_times(entry.get(family), all_levels)
            for level in levels:
                if level not in times:
                    times[level] = float(timer(family, level))
                    changed = True
            entry[family] = times
            wanted = {level: times[level] for level in levels}
            # the fastest; on a tie the wider variant
            choices[family] = min(wanted, key=lambda lv: (wanted[lv], -all_levels.index(lv)))
            engine.set_simd_choice(family, choices[family])
        if changed:
            entries[key] = entry
            _write(path, entries)
    finally:
        engine.set_simd_level(pinned)
    return choices


def simd_report(path: Path | None = None) -> str:
    """Returns the CPU, the cap, each family's variant times (ms) from the cache and its choice.

    Args:
        path: the cache file (default :func:`cache_file`).

    >>> print(simd_report())  # doctest: +SKIP
    CPU: Intel(R) Xeon(R) Processor (16 cores), supports avx512, cap avx512
    family               base     avx2   avx512  runs
    sort_rows_16        0.152    0.095    0.087  avx512
    ...
    """
    entries = _read(path or cache_file())
    entry = entries.get(_key(), {})
    lines = [
        f"CPU: {cpu_model()} ({os.cpu_count()} cores), supports {engine.supported_simd_level()}, "
        f"cap {engine.simd_level()}",
        f"{'family':<16} " + " ".join(f"{lv:>8}" for lv in engine.SIMD_LEVELS) + "  runs",
    ]
    levels = engine.SIMD_LEVELS
    for family in engine.simd_families():
        times = _valid_times(entry.get(family) if isinstance(entry, dict) else None, levels)
        cells = " ".join(
            f"{times[lv] * 1e3:8.3f}" if lv in times else f"{'-':>8}" for lv in levels
        )
        lines.append(f"{family:<16} {cells}  {engine.simd_family_level(family)}")
    return "\n".join(lines)


def apply() -> None:
    """Chooses at import (see the module's docstring), unless POPTORCH_SIM_SIMD_MEASURE=0."""
    if not env.simd_measure():
        return
    measured: list[str] = []

    def timer(family: str, level: str) -> float:
        measured.append(family)
        return measure(family, level)

    choose(timer)
    if measured:  # the samples' calls are not the user's: counters start from zero
        engine.reset_counters()
