"""Times the short-row sort in every SIMD variant this CPU runs, against torch.sort and np.sort.

Run ``.venv/bin/python benchmarks/simd_variants.py`` (``--tiles 1`` for one thread, ``--quick``
for a smoke run). For each row
length, 2^20 float32 items in all: the default dispatch (each family's measured variant, see
``poptorch_sim.kernels.simd_choice``), each variant pinned, the 8-lane network compiled for AVX2
(``torch.ops.poptorch_sim._sort_rows_8_lanes``, one tile), ``torch.sort`` and ``np.sort`` (values
only). Medians of interleaved repeats, in ms; every variant's result is checked against
``torch.sort(stable=True)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from poptorch_sim import kernels  # noqa: E402
from poptorch_sim.kernels import engine  # noqa: E402


def medians(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each call, timed in turn repeat by repeat after one warm-up each."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def header() -> str:
    """The CPU, its cores, the SIMD levels and the measured choices (where this build has them)."""
    if hasattr(kernels, "simd_report"):
        return kernels.simd_report()
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        "unknown CPU",
    )
    return (
        f"CPU: {model} ({os.cpu_count()} cores), supports {kernels.supported_simd_level()}, "
        f"level {kernels.simd_level()}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, default=0, help="tile count (0: the default)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--lengths", type=int, nargs="*", default=[16, 64, 256, 1024, 4096, 32768])
    parser.add_argument("--quick", action="store_true", help="2^16 items, rows of 16/256/4096")
    args = parser.parse_args(argv)
    total = 1 << (16 if args.quick else 20)
    if args.quick:
        args.repeats, args.lengths = 3, [16, 256, 4096]
    if args.tiles:
        kernels.set_num_tiles(args.tiles)
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {kernels.num_tiles()} tiles"
    )
    print(header())
    levels = engine.SIMD_LEVELS[: engine.SIMD_LEVELS.index(kernels.supported_simd_level()) + 1]
    # the 8-lane test hook, where setup.py built it (see [Note: the 8-lane hook] there)
    built = torch.ops.poptorch_sim._sort_rows_8_lanes_built()
    hook = torch.ops.poptorch_sim._sort_rows_8_lanes if built else None
    names = ["default", *levels, *(["8-lane hook"] if hook is not None else []), "torch", "np"]
    print(f"{'rows x length':<14}" + "".join(f"{name:>13}" for name in names) + "  (ms)")
    for n in args.lengths:
        x = torch.randn(total // n, n)
        xn = x.numpy()
        ref_values, ref_indices = torch.sort(x, dim=1, stable=True)

        def pinned(level: str, x: torch.Tensor = x) -> Callable[[], Any]:
            def sort_pinned() -> Any:
                with kernels.simd(level):
                    return torch.ops.poptorch_sim.sort(x, 1)

            return sort_pinned

        calls: dict[str, Callable[[], Any]] = {
            "default": lambda x=x: torch.ops.poptorch_sim.sort(x, 1)
        }
        calls |= {level: pinned(level) for level in levels}
        if hook is not None:

            def one_tile(x: torch.Tensor = x) -> Any:
                with kernels.tiles(1):
                    return hook(x)

            calls["8-lane hook"] = one_tile
        for name, call in calls.items():
            values, indices = call()
            if not (torch.equal(values, ref_values) and torch.equal(indices, ref_indices)):
                print(f"  {name}: result differs from torch.sort(stable=True)")
        calls["torch"] = lambda x=x: torch.sort(x, dim=1)
        calls["np"] = lambda xn=xn: np.sort(xn, axis=1)
        times = medians(calls, args.repeats)
        print(
            f"{x.shape[0]:>6} x {n:<6}" + "".join(f"{times[name] * 1e3:>13.3f}" for name in names)
        )


if __name__ == "__main__":
    main()
