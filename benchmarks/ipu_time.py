"""Predicted against published IPU throughput: the time model's calibration and validation rows.

Each row is an audited MLPerf Training result of Graphcore's (closed division; configurations
from the mlcommons training_results repositories; throughput recomputed from the result logs by
``benchmarks/published/mlperf_logs.py``, see ../shared/reference/ipu-hardware.md). The script
builds each configuration, compiles it for an offline target of the row's IPU
(``useOfflineIpuTarget(2)`` Mk2, ``(21)`` Bow: nothing runs), reads
``poptorch_sim.time_report`` and prints predicted against published samples per second, each
row's error, and the mean and maximum error of each table:

- calibration: the four IPU-POD16 Mk2 rows of MLPerf v1.0 and v1.1 (``CONFIGURATIONS``), the
  only rows the parameters were fitted on (target: within 10%);
- validation (not fitted): the IPU-POD64 Mk2 rows of v1.0 and v1.1 and the Bow Pod16 / Pod64
  rows of v2.0 (``VALIDATION``; target: within 20%). They differ from the calibration rows in
  replicas (64-IPU all-reduce), IPU (Bow's clock), placement (8-IPU BERT pipelines, cut
  between attention and feed-forward from v1.1) and micro-batch.

The configurations are those of ``benchmarks/published`` (built on the meta device, as the
audited runs had them: BERT-Large [3,7,7,7] with the embedding and heads on IPU 0, 4 replicas,
micro-batch 2, GA 192, FP16, LAMB off chip with RTS, a checkpoint after every layer and
PopTorch's pipeline recomputation; ResNet-50 v1.5 on 16 replicas, micro-batch 20, GA 6 and 10,
FP16 from 8-bit images, SGD with a combined accumulator, RecomputeAll with Graphcore's
checkpoints; the validation rows as ``VALIDATION`` lists them). A BERT sample is a pack:
sequences per second = packs per second × the mean sequences per pack that the project's SPFHP
gives on the Wikipedia length histogram (at most 3 per pack).

``--cost`` measures what the time estimate adds to a compile, for the models of
``benchmarks/models.py`` (its FULL sizes, pipelined training): the op counting in the shared
analysis's fake forward (the analysis run again with and without it) and the estimate itself,
against the whole compile.

``--fit`` searches the fitted parameters ([Note: calibration] in
``poptorch_sim/timing/calibration.py``) on the four calibration rows and prints the best; the
validation rows are never fitted on.

``--quick`` runs the ResNet-50 rows only (BERT-Large's compile takes half a minute), and of the
validation rows one per system the model extrapolates to (IPU-POD64 v1.0, Bow Pod16).

Exit status 1 when the calibration misses its target (the fit is broken); a validation row that
misses its target is named, and fails the run only with ``--strict``.

Run: ``python benchmarks/ipu_time.py [--quick] [--fit] [--only bert|resnet] [--strict]
[--no-validation] [--cost]``
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/published
os.environ.setdefault("POPTORCH_SIM_OFFLINE", "1")

from published import CONFIGURATIONS, VALIDATION, compile_published  # noqa: E402

import poptorch_sim as poptorch  # noqa: E402
from poptorch_sim.packing import pack_histogram  # noqa: E402
from poptorch_sim.timing import CALIBRATION, Calibration  # noqa: E402
from poptorch_sim.timing.estimate import estimate  # noqa: E402
from poptorch_sim.timing.settings import time_settings  # noqa: E402

# Graphcore's published length histogram (512 counts, one per line). The project does not ship
# it: it lies in the steering repository's shared/reference/ beside a checkout; --histogram
# points elsewhere.
HISTOGRAM = Path(__file__).resolve().parents[2] / "shared/reference/wikipedia_512_histogram.txt"


@dataclass(frozen=True)
class Row:
    """One published result and the configuration it ran (``benchmarks/published``)."""

    config: Any  # published.Published

    @property
    def name(self) -> str:
        """Round, system and model: ``v1.0 POD16 BERT-Large``."""
        round_, system = (part.strip() for part in self.config.source.split(",", 1))
        system = system.removeprefix("IPU-").removesuffix(" (Mk2)")
        return f"{round_.split()[-1]} {system} {self.config.name.split(' mb')[0]}"

    @property
    def published(self) -> float:
        return float(self.config.published)

    @property
    def model(self) -> str:
        return "bert" if self.config.name.startswith("BERT") else "resnet"


ROWS = [Row(c) for c in CONFIGURATIONS]
VALIDATION_ROWS = [Row(c) for c in VALIDATION]
# --quick's validation rows: one ResNet-50 per system the model extrapolates to (POD64, Bow).
QUICK_VALIDATION = ("ResNet-50 mb 20 GA 2 x64", "ResNet-50 mb 22 GA 10 x16 v21")
CALIBRATION_TARGET = 0.10  # max |error| on the rows the parameters were fitted on
VALIDATION_TARGET = 0.20  # max |error| on the rows they were not


def sequences_per_pack(path: Path | None = None) -> float:
    """Mean sequences per pack of SPFHP (at most 3 per pack) on a length histogram."""
    path = path or HISTOGRAM
    if not path.is_file():
        raise SystemExit(
            f"no length histogram at {path}: give Graphcore's Wikipedia histogram (512 counts, "
            "one per line) with --histogram FILE"
        )
    hist = np.loadtxt(path, dtype=np.int64)
    groups = pack_histogram(hist, len(hist), max_sequences_per_pack=3, algorithm="spfhp")
    packs = sum(g.count for g in groups)
    return sum(g.count * len(g.lengths) for g in groups) / packs


@dataclass
class Compiled:
    """A compiled row: what the estimate reads, kept to re-estimate with other parameters."""

    row: Row
    analysis: Any
    settings: Any
    trainer: Any
    scale: float  # published samples per predicted sample (sequences per pack)
    compile_s: float


def compile_row(row: Row, cache: dict[str, Compiled]) -> Compiled:
    """Compile ``row``'s configuration offline on the meta device (once per configuration)."""
    key = row.config.name
    if key not in cache:
        start = time.perf_counter()
        model = compile_published(row.config)
        exe = model._executable
        settings = time_settings(model._options, True, exe.analysis.mode, len(exe.analysis.ipus))
        scale = sequences_per_pack() if row.model == "bert" else 1.0
        cache[key] = Compiled(
            row, exe.analysis, settings, exe.trainer, scale, time.perf_counter() - start
        )
        model.destroy()
    return dataclasses.replace(cache[key], row=row)


def predict(c: Compiled, cal: Calibration) -> float:
    """Predicted samples per second of ``c`` with parameters ``cal``."""
    return c.scale * estimate(c.analysis, c.settings, c.trainer, cal).samples_per_second


def errors(rows: list[Compiled], cal: Calibration) -> list[float]:
    """Relative error of each row (predicted / published - 1)."""
    return [predict(c, cal) / c.row.published - 1 for c in rows]


def fit(rows: list[Compiled]) -> Calibration:
    """``amp_efficiency`` and ``conv_efficiency`` with the smallest maximum error over ``rows``
    (a coarse grid, then a fine one around its best); the set parameters are kept."""
    best, best_err = CALIBRATION, float("inf")
    grid = [0.05 * i for i in range(1, 20)]
    grids = [(grid, grid)]
    for level in range(2):
        for amp, conv in itertools.product(*grids[level]):
            cal = dataclasses.replace(CALIBRATION, amp_efficiency=round(amp, 3),
                                      conv_efficiency=round(conv, 3))  # fmt: skip
            err = max(abs(e) for e in errors(rows, cal))
            if err < best_err:
                best, best_err = cal, err
        grids.append(tuple(
            [round(v + 0.005 * i, 3) for i in range(-10, 11) if 0 < v + 0.005 * i <= 1]
            for v in (best.amp_efficiency, best.conv_efficiency)
        ))  # fmt: skip
    return best


class _NoCounter:
    """Stands in for ``OpCounter`` to time the analysis without op counting."""

    def __init__(self) -> None:
        from poptorch_sim.analysis import OpTotals

        self.totals = OpTotals()

    def __enter__(self) -> _NoCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _analysis_seconds(exe: Any, count: bool, repeats: int = 3) -> float:
    from poptorch_sim.analysis.program import analyse_program
    from poptorch_sim.memory import activations

    first = exe.layout.micro_batch(exe.inputs, 0, 0, 0)
    real = activations.OpCounter
    activations.OpCounter = real if count else _NoCounter  # type: ignore[misc]
    try:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            analyse_program(exe.program, first, exe.trainer is not None)
            times.append(time.perf_counter() - start)
        return min(times)
    finally:
        activations.OpCounter = real  # type: ignore[misc]


def cost() -> None:
    """Print what the time estimate adds to the compile of each model of models.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models

    print(f"{'model':<22}{'compile':>10}{'counting':>10}{'estimate':>10}{'share':>8}")
    for key, case in models.CASES.items():
        size = dataclasses.replace(models.FULL, ga=max(models.FULL.ga, 2 * case.stages - 1))
        torch.manual_seed(0)
        model = case.build(size)
        batch = case.batch(size.micro * size.ga, size)
        _, sim = models.sim_call(case, model, batch, size, "pipelined", True)
        start = time.perf_counter()
        sim.compile(**batch)
        compile_s = time.perf_counter() - start
        exe = sim._executable
        counting = max(0.0, _analysis_seconds(exe, True) - _analysis_seconds(exe, False))
        estimate_s = poptorch.time_report(sim).seconds
        share = (counting + estimate_s) / compile_s
        print(f"{key:<22}{compile_s:>9.2f}s{1e3 * counting:>8.1f}ms{1e3 * estimate_s:>8.1f}ms"
              f"{100 * share:>7.1f}%")  # fmt: skip
        sim.destroy()


def main(argv: list[str] | None = None) -> int:
    global HISTOGRAM  # --histogram: the file sequences_per_pack reads
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the parameters on these rows")
    parser.add_argument("--only", choices=("bert", "resnet"), help="one model's rows")
    parser.add_argument("--cost", action="store_true", help="the estimate's share of compiles")
    parser.add_argument("--quick", action="store_true", help="the ResNet-50 rows only")
    parser.add_argument("--no-validation", action="store_true", help="the calibration rows only")
    parser.add_argument("--strict", action="store_true", help="fail on a validation miss too")
    parser.add_argument("--histogram", type=Path, help=f"BERT's length histogram ({HISTOGRAM})")
    args = parser.parse_args(argv)
    HISTOGRAM = args.histogram or HISTOGRAM
    if args.quick:
        args.only = "resnet"
    if args.cost:
        cost()
        return 0
    cache: dict[str, Compiled] = {}
    rows = [compile_row(r, cache) for r in ROWS if args.only in (None, r.model)]
    start = time.perf_counter()
    cal = fit(rows) if args.fit else CALIBRATION
    if args.fit:
        print(f"fitted in {time.perf_counter() - start:.0f} s: {cal}")
    if any(r.model == "bert" for r in ROWS if args.only in (None, r.model)):
        print(f"BERT sequences per pack (SPFHP, at most 3, Wikipedia histogram): "
              f"{sequences_per_pack():.3f}")  # fmt: skip
    calibration = table("calibration (fitted on these rows)", rows, cal)
    status = 0 if calibration <= CALIBRATION_TARGET else 1
    if args.fit or args.no_validation:
        return status
    chosen = [r for r in VALIDATION_ROWS if args.only in (None, r.model)]
    chosen = [r for r in chosen if not args.quick or r.config.name in QUICK_VALIDATION]
    checks = [compile_row(r, cache) for r in chosen]
    table("validation (not fitted)", checks, cal)
    misses = [
        c.row.name for c, e in zip(checks, errors(checks, cal)) if abs(e) > VALIDATION_TARGET
    ]
    missed = f"; missed by {', '.join(misses)}" if misses else ""
    print(f"targets |error|: calibration {100 * CALIBRATION_TARGET:.0f}%, validation "
          f"{100 * VALIDATION_TARGET:.0f}%: {len(checks) - len(misses)} of {len(checks)} "
          f"validation rows within{missed}")  # fmt: skip
    return 1 if misses and args.strict else status


def table(title: str, rows: list[Compiled], cal: Calibration) -> float:
    """Print ``rows`` predicted against published; returns the maximum |error|."""
    print(f"-- {title}")
    print(f"{'row':<28}{'published':>12}{'predicted':>12}{'ratio':>8}{'error':>9}{'compile':>10}")
    errs = errors(rows, cal)
    for c, err in zip(rows, errs):
        print(f"{c.row.name:<28}{c.row.published:>12,.0f}{predict(c, cal):>12,.0f}"
              f"{1 + err:>7.3f}x{100 * err:>8.1f}%{c.compile_s:>9.1f}s")  # fmt: skip
    absolute = [abs(e) for e in errs]
    print(f"mean |error| {100 * statistics.mean(absolute):.1f}%, "
          f"max |error| {100 * max(absolute):.1f}%")  # fmt: skip
    return max(absolute)


if __name__ == "__main__":
    sys.exit(main())
