"""The memory estimate against a measured step, and its cost against the compile it is part of.

Run ``.venv/bin/python benchmarks/memory_estimate.py`` (``--repeats N``, default 3; ``--quick``
for the MLPs, once each). For each
model of ``tests/test_memory.py`` (MLPs, a CNN, tiny BERT and GPT-2 over 2-4 IPUs), it compiles
the model ``N`` times and prints the median compile time, the median time of the estimate made
inside it, its share of the compile and the ratio compile / estimate; then it trains one step with the probe on and prints, summed over the
IPUs, the estimated and measured bytes of weights, optimizer state and peak activations, with
the largest per-IPU relative difference of the activations.

Then (not with ``--quick``; alone with ``--published``) Graphcore's published MLPerf Training
configurations (``benchmarks/published``: BERT-Large [3,7,7,7] at micro-batch 2, GA 192, 4
replicas, LAMB state off chip with RTS; ResNet-50 at micro-batch 20, GA 6 and 10, 16 replicas),
built on the meta device and compiled offline: the memory used on each IPU of a replica (they
ran on hardware, so none may be over 100%), the seconds the offline compile took and the
process's peak resident memory after it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import test_memory as cases  # noqa: E402
from published import CONFIGURATIONS, compile_published  # noqa: E402

import poptorch_sim as poptorch  # noqa: E402
from poptorch_sim.memory import measure, memory_report  # noqa: E402


def _build(case: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    if case in cases.CASES:
        make, batch, ga, kw, kind = cases.CASES[case]
        kw = dict(kw)
        replicas = kw.pop("replicas", 1)
        net = make()
        opts = cases.case_options(ga, replicas, **kw)
        model = poptorch.trainingModel(net, opts, cases.case_optimizer(kind, net.parameters()))
        return model, batch(4 * ga * replicas), {}
    net, batch, opts = cases.transformer_case(case)
    model = poptorch.trainingModel(net, opts, poptorch.optim.AdamW(net.parameters(), lr=1e-3))
    return model, (), batch


def run(case: str, repeats: int) -> str:
    compiles, estimates = [], []
    for _ in range(repeats):
        torch.manual_seed(0)
        model, args, kwargs = _build(case)
        start = time.perf_counter()
        model.compile(*args, **kwargs)
        compiles.append(time.perf_counter() - start)
        estimates.append(memory_report(model).seconds)
        model.destroy()
    model, args, kwargs = _build(case)
    measured = measure(model, *args, **kwargs)
    report = memory_report(model)
    model.destroy()
    est = [sum(getattr(m, f) for m in report.ipus) for f in ("weights", "optimizer_state")]
    got = [sum(getattr(m, f) for m in measured) for f in ("weights", "optimizer_state")]
    acts = (sum(m.activations for m in report.ipus), sum(m.activations for m in measured))
    worst = max(abs(e.activations - g.activations) / g.activations
                for e, g in zip(report.ipus, measured))  # fmt: skip
    c, e = statistics.median(compiles), statistics.median(estimates)
    return (
        f"{case:<38} {1e3 * c:7.0f} {1e3 * e:7.1f} {100 * e / c:5.1f}% {c / e:6.1f}x  "
        f"{est[0]:>8}/{got[0]:<8} {est[1]:>8}/{got[1]:<8} {acts[0]:>8}/{acts[1]:<8} "
        f"{100 * worst:4.1f}%"
    )


def published_row(config: Any) -> str:
    """One published configuration: its memory per IPU (% of the limit), compile seconds."""
    start = time.perf_counter()
    model = compile_published(config)
    seconds = time.perf_counter() - start
    report = memory_report(model)
    model.destroy()
    used = " ".join(f"{100 * m.total / m.limit:5.1f}%" for m in report.ipus)
    over = " OUT OF MEMORY" if report.over_limit else ""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return f"{config.name:<38} {config.source:<40} {seconds:6.1f} {peak:5.2f}  {used}{over}"


def print_published() -> None:
    print(f"\n{'published configuration':<38} {'result':<40} {'compile':>6} {'peak':>5}  "
          "memory used per IPU of a replica")  # fmt: skip
    print(f"{'':<38} {'':<40} {'s':>6} {'GiB':>5}")
    for config in CONFIGURATIONS:
        print(published_row(config), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the MLPs only, compiled once")
    parser.add_argument("--published", action="store_true",
                        help="only the published configurations")  # fmt: skip
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    load = os.getloadavg()[0]
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f}, torch {torch.__version__}")  # fmt: skip
    chosen = [*cases.CASES, *cases.transformers_cases]
    if args.quick:
        chosen = [c for c in chosen if c.startswith("mlp")]
    if args.published:
        chosen = []
    if chosen:
        print(f"{'model':<38} {'compile':>7} {'est.':>7} {'share':>6} {'ratio':>7}  "
              f"{'weights est/meas':>17} {'opt. state est/meas':>17} "
              f"{'activations est/meas':>17} worst")  # fmt: skip
        print(f"{'':<38} {'ms':>7} {'ms':>7}")
    for case in chosen:
        print(run(case, 1 if args.quick else args.repeats), flush=True)
    if not args.quick:
        print_published()


if __name__ == "__main__":
    main()
