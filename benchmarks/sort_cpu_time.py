"""Times the sort in CPU seconds per call against torch.sort and numpy, for busy machines.

Run ``.venv/bin/python benchmarks/sort_cpu_time.py [--quick]``. Every case sorts 2^20 float32 (one row,
then rows of 16 to 4096) and prints medians of 9 calls in process CPU time (all threads, from
``getrusage``), which host contention distorts far less than wall time; ``--ours-only`` times
only poptorch_sim (to compare builds in alternated processes).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from poptorch_sim import kernels  # noqa: E402


def cpu_seconds() -> float:
    """CPU seconds this process has used, all threads, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def median_cpu(fn: Callable[[], Any], repeats: int = 9) -> float:
    """Median CPU seconds of ``fn`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = cpu_seconds()
        fn()
        times.append(cpu_seconds() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    """Prints one line per case: ours in ms, and each reference as a ratio to ours."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours-only", action="store_true", help="time poptorch_sim only")
    parser.add_argument("--quick", action="store_true", help="2^16 items instead of 2^20")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    total = 1 << (16 if args.quick else 20)
    for rows, n in [(1, total)] + [(total // n, n) for n in (16, 64, 256, 1024, 4096)]:
        x = torch.randn(rows, n) if rows > 1 else torch.randn(n)
        xn = x.numpy()
        ours = median_cpu(lambda x=x: kernels.sort(x, dim=-1))
        line = f"{rows}x{n}: ours {ours * 1e3:.2f} ms CPU"
        if not args.ours_only:
            references = {
                "torch.sort": lambda x=x: torch.sort(x, dim=-1),
                "np stable argsort+take": lambda xn=xn: np.take_along_axis(
                    xn, np.argsort(xn, axis=-1, kind="stable"), axis=-1
                ),
                "np.sort (values only)": lambda xn=xn: np.sort(xn, axis=-1),
            }
            for name, fn in references.items():
                line += f" | {name} {median_cpu(fn) / ours:.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
