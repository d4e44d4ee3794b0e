"""Scale-out over processes: samples/s for 1 and 2 instances, and bytes all-reduced per step.

Each instance trains the same MLP (``layers`` Linear+ReLU of width ``width``, MSE loss) with one
local replica, ``--ga`` micro-batches of ``--mb`` rows per step and one intra-op thread per IPU worker
(``OMP_NUM_THREADS=1``, ``POPTORCH_SIM_THREADS_PER_IPU=1``). The instances are started by
``python -m poptorch_sim.poprun``; each replica does the same work per step, so 2 replicas do
twice the work of one and ``samples/s`` counts the samples of all replicas and instances.

Rows: 1 instance with 1 replica (the baseline), 1 instance with 2 replicas (worker threads in
one process, no all-reduce), 2 instances with 1 replica each (processes, one all-reduce per
step). The last column is samples/s over the baseline's, measured in the same run (ideal 2.0 on
two idle cores). ``--rows 1x1,2x2`` runs only the rows named (INSTANCESxREPLICAS, the baseline
first); each row is a launch of its own (a launcher and its instances, each importing torch).
``all-reduce`` is the median wall time of the cross-process gradient all-reduce per step
(including any wait for the other process to reach the step), ``bytes/step`` what one process
sends into it (its fp32 gradients: equal to the model's parameter bytes, as the table shows),
for a few model sizes.

Run: ``python benchmarks/scale_out.py [--quick] [--skip-sizes] [--rows 1x1,2x2]`` (writes
nothing; prints two tables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _model(width: int, layers: int):  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                *[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]
            )

        def forward(self, x: torch.Tensor, y: torch.Tensor):  # type: ignore[no-untyped-def]
            out = self.body(x)
            return out, nn.functional.mse_loss(out, y)

    return MLP()


def _allreduce_seconds(training: Any) -> float:
    """Seconds the model has spent in gradient all-reduces so far (0 for one process)."""
    from poptorch_sim.executor import allreduce_stats

    stats = allreduce_stats(training)
    return stats.seconds if stats is not None else 0.0


def worker(args: argparse.Namespace) -> None:
    """One instance: time ``--calls`` training calls; instance 0 writes the figures."""
    import torch

    import popdist
    import popdist.poptorch
    import poptorch
    from poptorch_sim.executor import allreduce_stats

    popdist.init()
    torch.manual_seed(0)
    model = _model(args.width, args.layers)
    opts = popdist.poptorch.Options()
    opts.Training.gradientAccumulation(args.ga)
    training = poptorch.trainingModel(
        model, opts, optimizer=poptorch.optim.SGD(model.parameters(), lr=1e-3)
    )
    rows = args.mb * args.ga * popdist.getNumLocalReplicas()
    x, y = torch.randn(rows, args.width), torch.randn(rows, args.width)
    training(x, y)  # compile + warm-up
    times, reduce_times = [], []
    for _ in range(args.calls):
        before = _allreduce_seconds(training)
        start = time.perf_counter()
        training(x, y)
        times.append(time.perf_counter() - start)
        reduce_times.append(_allreduce_seconds(training) - before)
    stats = allreduce_stats(training)
    if popdist.getInstanceIndex() == 0:
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        Path(args.out).write_text(
            json.dumps(
                {
                    "instances": popdist.getNumInstances(),
                    "call_s": statistics.median(times),
                    "samples_per_call": rows * popdist.getNumInstances(),
                    "allreduce_s": statistics.median(reduce_times),
                    "bytes_per_step": stats.bytes_per_step if stats is not None else 0,
                    "model_bytes": params,
                }
            )
        )


def launch(instances: int, replicas: int, args: argparse.Namespace, width: int) -> dict:
    """Run the worker under the launcher (``replicas`` in all); return instance 0's figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "poptorch_sim.poprun", "--num-instances", str(instances),
            "--num-replicas", str(replicas), __file__, "--worker", "--out", str(out),
            "--width", str(width), "--layers", str(args.layers), "--mb", str(args.mb),
            "--ga", str(args.ga), "--calls", str(args.calls),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "POPTORCH_SIM_THREADS_PER_IPU": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(
                f"{instances} instance(s) x {replicas} replica(s) exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
            )
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="fewer calls, fewer model sizes")
    add("--worker", action="store_true", help=argparse.SUPPRESS)
    add("--out", default="", help=argparse.SUPPRESS)
    add("--width", type=int, default=512, help="MLP width (default 512)")
    add("--layers", type=int, default=4, help="Linear layers (default 4)")
    add("--mb", type=int, default=32, help="micro-batch rows (default 32)")
    add("--ga", type=int, default=8, help="gradient accumulation (default 8)")
    add("--calls", type=int, default=20, help="timed calls (default 20)")
    add("--skip-sizes", action="store_true", help="only the first table (samples/s)")
    add("--rows", default="1x1,1x2,2x2", help="the first table's rows (default 1x1,1x2,2x2)")
    args = parser.parse_args()
    try:
        rows = [tuple(int(n) for n in row.split("x")) for row in args.rows.split(",")]
    except ValueError:
        rows = []
    if rows[:1] != [(1, 1)] or any(
        len(row) != 2 or min(row) < 1 or row[1] % row[0] for row in rows
    ):
        parser.error(
            f"--rows {args.rows}: INSTANCESxREPLICAS, replicas a multiple of instances, 1x1 first"
        )
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.calls = 3

    print(f"MLP {args.layers} x {args.width}, mb {args.mb}, GA {args.ga}, 1 replica/instance")
    print("| instances | replicas (global) | samples/s (median call) | vs 1 instance, 1 replica |")
    print("|---|---|---|---|")
    base = None
    for n, replicas in rows:
        r = launch(n, replicas, args, args.width)
        rate = r["samples_per_call"] / r["call_s"]
        base = base or rate
        print(f"| {n} | {replicas} | {rate:,.0f} | {rate / base:.2f}x |")

    if args.skip_sizes:
        return
    print("\n| model (width) | parameter bytes | bytes all-reduced/step/process | all-reduce ms |")
    print("|---|---|---|---|")
    for width in (128,) if args.quick else (128, 512, 1024):
        r = launch(2, 2, args, width)
        print(
            f"| {args.layers} x {width} | {r['model_bytes']:,} | {r['bytes_per_step']:,} | "
            f"{1e3 * r['allreduce_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
