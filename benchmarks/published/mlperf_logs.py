"""Recomputes a published row's throughput from MLPerf Training result logs (``:::MLLOG`` lines).

The rule, the same for every row of ``benchmarks/ipu_time.py`` (calibration and validation):
each run's rate is the median over its training blocks, and the row's figure is the median over
the runs.

- ResNet-50: a block is an epoch, 1,281,167 images over its ``epoch_start``-``epoch_stop`` time.
- BERT: a block is ``block_start``-``block_stop``; its samples are the rise of ``epoch_num`` (the
  sequences trained so far) at the ``eval_accuracy`` after it.

Run on a clone of an mlcommons ``training_results_v*`` repository::

    python benchmarks/published/mlperf_logs.py training_results_v1.0/Graphcore/results/ipu-pod16-TF1/resnet
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

IMAGENET_TRAIN_IMAGES = 1281167


def events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The ``:::MLLOG`` events of a result log, in order."""
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in lines if ":::MLLOG" in line]


def block_rates(log: list[dict[str, Any]], bert: bool) -> list[float]:
    """Samples per second of each training block of one run (see the module docstring)."""
    start, ended, trained = None, None, 0
    rates = []
    for event in log:
        key, t = event["key"], event["time_ms"] / 1e3
        if key == ("block_start" if bert else "epoch_start"):
            start = t
        elif key == ("block_stop" if bert else "epoch_stop") and start is not None:
            seconds, start = t - start, None
            if not bert:
                rates.append(IMAGENET_TRAIN_IMAGES / seconds)
            else:
                ended = seconds
        elif bert and key == "eval_accuracy" and ended is not None:
            samples = event["metadata"]["epoch_num"]
            rates.append((samples - trained) / ended)
            trained, ended = samples, None
    return rates


def throughput(folder: Path) -> tuple[float, list[float]]:
    """The row's figure (median over runs of each run's median) and each run's median."""
    bert = "bert" in folder.parts[-1]
    runs = []
    for path in sorted(folder.glob("result_*.txt")):
        rates = block_rates(events(path.read_text().splitlines()), bert)
        if rates:
            runs.append(statistics.median(rates))
    if not runs:
        raise SystemExit(f"no result_*.txt with training blocks in {folder}")
    return statistics.median(runs), runs


def main(argv: list[str]) -> int:
    for folder in map(Path, argv or ["."]):
        figure, runs = throughput(folder)
        print(f"{folder}: {figure:,.1f} samples/s (median of {len(runs)} runs: "
              f"{min(runs):,.0f}-{max(runs):,.0f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
