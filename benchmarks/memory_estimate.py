"""The memory estimate against a measured step, and its cost against the compile it is part of.

Run ``.venv/bin/python benchmarks/memory_estimate.py`` (``--repeats N``, default 3; ``--quick``
for the MLPs, once each). For each
model of ``tests/test_memory.py`` (MLPs, a CNN, tiny BERT and GPT-2 over 2-4 IPUs), it compiles
the model ``N`` times and prints the median compile time, the median time of the estimate made
inside it, its share of the compile and the ratio compile / estimate; then it trains one step with the probe on and prints, summed over the
IPUs, the estimated and measured bytes of weights, optimizer state and peak activations, with
the largest per-IPU relative difference of the activations.
"""

from __future__ import annotations

import argparse
import datetime
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the MLPs only, compiled once")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    load = os.getloadavg()[0]
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f}, torch {torch.__version__}")  # fmt: skip
    print(f"{'model':<38} {'compile':>7} {'est.':>7} {'share':>6} {'ratio':>7}  "
          f"{'weights est/meas':>17} {'opt. state est/meas':>17} {'activations est/meas':>17} "
          "worst")  # fmt: skip
    print(f"{'':<38} {'ms':>7} {'ms':>7}")
    chosen = [*cases.CASES, *cases.transformers_cases]
    if args.quick:
        chosen = [c for c in chosen if c.startswith("mlp")]
    for case in chosen:
        print(run(case, 1 if args.quick else args.repeats), flush=True)


if __name__ == "__main__":
    main()
