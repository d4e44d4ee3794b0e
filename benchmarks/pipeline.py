"""Pipelined vs sharded vs plain PyTorch: throughput of balanced dense stages on IPU threads.

Each stage is ``layers`` Linear+ReLU layers of width ``width``; the last stage adds an MSE loss.
One *run* is forward+backward of ``M`` micro-batches of ``mb`` rows (gradient accumulation).

* pipelined: ``PipelineRuntime`` with the 1F1B schedule, one intra-op thread per IPU worker.
* sharded: the same stages, one micro-batch at a time (``ShardedExecution``), one thread per IPU.
* plain: the whole model in eager PyTorch on the main thread with every core as intra-op
  threads (``torch.set_num_threads(os.cpu_count())``).

The ideal pipelined/sharded speedup of ``N`` stages over ``M`` micro-batches is
``N*M / (M + N - 1)`` (the fill and drain bubbles); efficiency is measured / ideal. With more
stages than cores (``N=4`` on two cores) the workers share cores and the ideal is out of reach.

Run: ``.venv/bin/python benchmarks/pipeline.py [--quick] [--trace trace.json]``
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from poptorch_sim.profiling.trace import TraceRecorder
from poptorch_sim.program import StagedProgram, StageSpec
from poptorch_sim.runtime import PipelineRuntime

CPU = torch.device("cpu")


class DenseStack(nn.Module):
    """``layers`` Linear+ReLU; with ``loss`` it also returns the MSE against ``target``."""

    def __init__(self, width: int, layers: int, loss: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]
        )
        self.loss = loss

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.body(args[0])
        if self.loss:
            return (nn.functional.mse_loss(h, args[1]),)
        return (h,)


def build(num_stages: int, width: int, layers: int, sharded: bool) -> StagedProgram:
    stages = []
    for s in range(num_stages):
        last = s == num_stages - 1
        inputs = ("x" if s == 0 else f"h{s}",) + (("y",) if last else ())
        outputs = ("loss",) if last else (f"h{s + 1}",)
        stages.append(StageSpec(s, s, DenseStack(width, layers, last), inputs, outputs))
    return StagedProgram(stages, ("x", "y"), ("loss",), loss_name="loss", sharded=sharded)


def batches(count: int, mb: int, width: int) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.randn(mb, width), "y": torch.randn(mb, width)} for _ in range(count)]


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_runtime(program: StagedProgram, data: list, repeats: int) -> float:  # type: ignore[type-arg]
    with PipelineRuntime(
        program, training=True, devices=dict.fromkeys(range(8), CPU), threads_per_ipu=1
    ) as runtime:
        return median_time(lambda: runtime.run(data, loss_scale=1 / len(data)), repeats)


def time_plain(program: StagedProgram, data: list, repeats: int) -> float:  # type: ignore[type-arg]
    model = nn.ModuleList(copy.deepcopy(s.module) for s in program.stages)
    previous = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)

    def run() -> None:
        for values in data:
            h = values["x"]
            for stage in model[:-1]:
                (h,) = stage(h)
            (loss,) = model[-1](h, values["y"])
            (loss / len(data)).backward()

    try:
        return median_time(run, repeats)
    finally:
        torch.set_num_threads(previous)


def measure(args: argparse.Namespace) -> list[dict[str, float]]:
    rows = []
    for n in args.stages:
        for m in args.microbatches:
            data = batches(m, args.mb, args.width)
            piped = time_runtime(build(n, args.width, args.layers, False), data, args.repeats)
            shard = time_runtime(build(n, args.width, args.layers, True), data, args.repeats)
            plain = time_plain(build(n, args.width, args.layers, False), data, args.repeats)
            ideal = n * m / (m + n - 1)
            rows.append(dict(n=n, m=m, piped=piped, shard=shard, plain=plain, ideal=ideal))
            print_row(rows[-1], args.mb)
    return rows


HEADER = (
    f"{'N':>2} {'M':>3} {'pipelined ms':>13} {'sharded ms':>11} {'plain ms':>9} "
    f"{'pipe/shard':>10} {'ideal':>6} {'effic.':>7} {'pipe/plain':>10} {'samples/s':>10}"
)


def print_row(row: dict[str, float], mb: int) -> None:
    speedup = row["shard"] / row["piped"]
    print(
        f"{row['n']:>2.0f} {row['m']:>3.0f} {row['piped'] * 1e3:13.1f} {row['shard'] * 1e3:11.1f} "
        f"{row['plain'] * 1e3:9.1f} {speedup:9.2f}x {row['ideal']:5.2f}x "
        f"{speedup / row['ideal']:6.0%} {row['plain'] / row['piped']:9.2f}x "
        f"{row['m'] * mb / row['piped']:10.0f}",
        flush=True,
    )


def write_trace(args: argparse.Namespace) -> None:
    """One pipelined run (N=2, M=8) recorded as a Chrome trace, with the per-stage summary."""
    trace = TraceRecorder()
    program = build(2, args.width, args.layers, False)
    data = batches(8, args.mb, args.width)
    with PipelineRuntime(
        program, training=True, devices={0: CPU, 1: CPU}, threads_per_ipu=1, trace=trace
    ) as runtime:
        runtime.run(data)
        trace.clear()
        runtime.run(data)
    print(trace.summary())
    trace.write(args.trace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--trace", help="write a Chrome trace of one N=2, M=8 pipelined run")
    args = parser.parse_args()
    quick = args.quick
    args.width, args.layers, args.mb = (256, 2, 32) if quick else (512, 4, 64)
    args.repeats = 3 if quick else 7
    args.stages = [2] if quick else [2, 4]
    args.microbatches = [4, 8] if quick else [4, 8, 32]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, main intra-op threads "
        f"{torch.get_num_threads()}; stage = {args.layers} x Linear({args.width}) + ReLU, "
        f"mb = {args.mb}, median of {args.repeats} runs (fwd + bwd of M micro-batches)"
    )
    print(HEADER)
    measure(args)
    if args.trace:
        write_trace(args)


if __name__ == "__main__":
    main()
