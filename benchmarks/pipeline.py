"""Pipelined vs sharded vs plain PyTorch: throughput of balanced dense stages on IPU threads.

Each stage is ``layers`` Linear+ReLU layers of width ``width``; the last stage adds an MSE loss.
One *run* is forward+backward of ``M`` micro-batches of ``mb`` rows (gradient accumulation).

[Note: balanced stages]
A Linear layer costs three matmuls of its size per micro-batch (forward, weight gradient, input
gradient), except the model's first layer, whose input needs no gradient. Stage 0 would then do
``3L - 1`` units to every other stage's ``3L`` (1.2x less with ``L = 2``), and the last stage would
set the pace. So the program input is ``1.5 * width`` wide: stage 0's first layer does 1.5 units
forward and 1.5 for its weight gradient, the 3 units of every other layer, and all stages do the
same FLOPs.

* pipelined: ``PipelineRuntime`` with the 1F1B schedule, one intra-op thread per IPU worker.
* sharded: the same stages, one micro-batch at a time (``ShardedExecution``), one thread per IPU.
* plain: the whole model in eager PyTorch on the main thread with every core as intra-op
  threads (``torch.set_num_threads(os.cpu_count())``); plain-1t: the same on one thread.

``cpu pipe/plain-1t`` is CPU seconds of the pipelined run over those of the one-thread eager
loop: the runtime's overhead (threads, queues, split autograd), independent of the machine's
load, unlike the wall-clock ratios. ``ceiling`` is ``parallel_ceiling()`` measured right after
the row (about 1.8x on the idle two-core machine; near 1x means another process held a core).

A second table repeats pipelined vs sharded with stages that *wait* (sleep) for their fwd and
bwd instead of computing, as a kernel on an accelerator would: it measures the schedule and the
runtime's own overhead even on a machine whose cores are busy with other work.

A third and a fourth table do the same for inference, through the public API
(``poptorch.inferenceModel`` with ``deviceIterations(M)``, ``PipelinedExecution`` vs
``ShardedExecution``, each IPU worker on one intra-op thread), once with stages of real compute
(``layers`` Linear+ReLU of width ``width``, forward only) beside plain eager inference under
``torch.no_grad`` and the two-thread ceiling, and once with stages that only wait (a
``torch.fx.wrap``-ped sleep of ``wait_ms`` per micro-batch per stage).

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
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import poptorch_sim as poptorch
from poptorch_sim.profiling import TraceRecorder
from poptorch_sim.program import StagedProgram, StageSpec
from poptorch_sim.runtime import PipelineRuntime

CPU = torch.device("cpu")


class DenseStack(nn.Module):
    """``layers`` Linear+ReLU; with ``loss`` it also returns the MSE against ``target``."""

    def __init__(self, width: int, layers: int, loss: bool, in_width: int | None = None) -> None:
        super().__init__()
        widths = [in_width or width] + [width] * layers
        self.body = nn.Sequential(
            *[m for i in range(layers) for m in (nn.Linear(widths[i], width), nn.ReLU())]
        )
        self.loss = loss

    def after_body(self, h: torch.Tensor) -> torch.Tensor:
        return h

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.after_body(self.body(args[0]))
        if self.loss:
            return (nn.functional.mse_loss(h, args[1]),)
        return (h,)


class _Wait(torch.autograd.Function):
    """Identity that sleeps ``fwd_s`` in forward and ``2 * fwd_s`` in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd_s: float) -> torch.Tensor:
        ctx.fwd_s = fwd_s
        time.sleep(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.fwd_s)
        return grad, None


class WaitStage(DenseStack):
    """A stage whose time is spent waiting, as for a kernel on an accelerator: it measures the
    schedule and the runtime's overhead without needing free CPU cores."""

    def __init__(self, width: int, layers: int, loss: bool, fwd_s: float) -> None:
        super().__init__(width, layers, loss, width)
        self.fwd_s = fwd_s

    def after_body(self, h: torch.Tensor) -> torch.Tensor:
        return _Wait.apply(h, self.fwd_s)


def build(
    num_stages: int, width: int, layers: int, sharded: bool, wait_s: float = 0.0
) -> StagedProgram:
    stages = []
    for s in range(num_stages):
        last = s == num_stages - 1
        inputs = ("x" if s == 0 else f"h{s}",) + (("y",) if last else ())
        outputs = ("loss",) if last else (f"h{s + 1}",)
        if wait_s:
            module: nn.Module = WaitStage(width, layers, last, wait_s)
        else:  # See [Note: balanced stages]
            module = DenseStack(width, layers, last, input_width(width) if s == 0 else width)
        stages.append(StageSpec(s, s, module, inputs, outputs))
    return StagedProgram(stages, ("x", "y"), ("loss",), loss_name="loss", sharded=sharded)


def input_width(width: int) -> int:
    """Width of the program input. See [Note: balanced stages]."""
    return width * 3 // 2


def batches(
    count: int, mb: int, width: int, in_width: int | None = None
) -> list[dict[str, torch.Tensor]]:
    x_width = in_width or width
    return [{"x": torch.randn(mb, x_width), "y": torch.randn(mb, width)} for _ in range(count)]


def interleaved_medians(
    runners: dict[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
    """Median wall seconds of each runner (and ``cpu_<name>``: median process CPU seconds),
    timed in rotation so that changes in the machine's load hit all runners alike."""
    for run in runners.values():
        run()  # warm-up
    times: dict[str, list[float]] = {key: [] for name in runners for key in (name, f"cpu_{name}")}
    for _ in range(repeats):
        for name, run in runners.items():
            start, cpu = time.perf_counter(), time.process_time()
            run()
            times[name].append(time.perf_counter() - start)
            times[f"cpu_{name}"].append(time.process_time() - cpu)
    return {key: statistics.median(t) for key, t in times.items()}


def runtime_runner(program: StagedProgram, data: list, stack: ExitStack) -> Callable[[], object]:  # type: ignore[type-arg]
    devices = dict.fromkeys(range(len(program.stages)), CPU)
    runtime = stack.enter_context(
        PipelineRuntime(program, training=True, devices=devices, threads_per_ipu=1)
    )
    return lambda: runtime.run(data, loss_scale=1 / len(data))


def plain_runner(program: StagedProgram, data: list, threads: int) -> Callable[[], object]:  # type: ignore[type-arg]
    """The whole model eagerly on the main thread with ``threads`` intra-op threads."""
    model = nn.ModuleList(copy.deepcopy(s.module) for s in program.stages)

    def run() -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for values in data:
                h = values["x"]
                for stage in model[:-1]:
                    (h,) = stage(h)
                (loss,) = model[-1](h, values["y"])
                (loss / len(data)).backward()
        finally:
            torch.set_num_threads(previous)

    return run


def stage_costs(num_stages: int, args: argparse.Namespace, repeats: int = 50) -> list[float]:
    """Median ms of fwd+bwd of one micro-batch through each stage alone, on one thread."""
    program = build(num_stages, args.width, args.layers, False)
    (data,) = batches(1, args.mb, args.width, input_width(args.width))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        costs = []
        for spec in program.stages:
            x = (
                data["x"]
                if spec.index == 0
                else torch.randn(args.mb, args.width, requires_grad=True)
            )
            inputs = (x, data["y"]) if spec.index == num_stages - 1 else (x,)

            def fwd_bwd(inputs: tuple = inputs, module: nn.Module = spec.module) -> None:  # type: ignore[type-arg]
                (out,) = module(*inputs)
                out.backward(torch.ones_like(out))

            costs.append(interleaved_medians({"stage": fwd_bwd}, repeats)["stage"] * 1e3)
        return costs
    finally:
        torch.set_num_threads(previous)


def measure(args: argparse.Namespace) -> list[dict[str, float]]:
    rows, cores = [], os.cpu_count() or 1
    for n in args.stages:
        for m in args.microbatches:
            data = batches(m, args.mb, args.width, input_width(args.width))
            with ExitStack() as stack:
                runners = {
                    "piped": runtime_runner(build(n, args.width, args.layers, False), data, stack),
                    "shard": runtime_runner(build(n, args.width, args.layers, True), data, stack),
                    "plain": plain_runner(build(n, args.width, args.layers, False), data, cores),
                    "plain1": plain_runner(build(n, args.width, args.layers, False), data, 1),
                }
                row: dict[str, float] = dict(interleaved_medians(runners, args.repeats))
            # Measured right after the row: a row taken while other work held a core shows a
            # ceiling well under the quiet machine's ~1.8x, and its ratios mean little.
            row |= dict(
                n=n, m=m, ideal=n * m / (m + n - 1), ceiling=parallel_ceiling(matmuls=args.matmuls)
            )
            rows.append(row)
            print_row(row, args.mb)
    return rows


HEADER = (
    f"{'N':>2} {'M':>3} {'pipelined':>9} {'sharded':>8} {'plain':>8} {'plain-1t':>8}  "
    f"{'pipe/shard':>10} {'ideal':>6} {'effic.':>6} {'pipe/plain':>10} {'pipe/plain-1t':>13} "
    f"{'cpu pipe/plain-1t':>17} {'ceiling':>7}"
)


def print_row(row: dict[str, float], mb: int) -> None:
    """Times in ms (medians); ratios are throughput ratios (time of the other / pipelined)."""
    speedup = row["shard"] / row["piped"]
    times = " ".join(
        f"{row[k] * 1e3:{w}.1f}"
        for k, w in (("piped", 9), ("shard", 8), ("plain", 8), ("plain1", 8))
    )
    print(
        f"{row['n']:>2.0f} {row['m']:>3.0f} {times}  {speedup:9.2f}x {row['ideal']:5.2f}x "
        f"{speedup / row['ideal']:6.0%} {row['plain'] / row['piped']:9.2f}x "
        f"{row['plain1'] / row['piped']:12.2f}x {row['cpu_piped'] / row['cpu_plain1']:16.2f}x "
        f"{row['ceiling']:6.2f}x",
        flush=True,
    )


def measure_waiting(args: argparse.Namespace) -> None:
    """Pipelined vs sharded with stages that wait (sleep) instead of computing."""
    print(f"\nstages that wait {args.wait_ms} ms per fwd, {2 * args.wait_ms} ms per bwd "
          "(tiny compute): the schedule alone")  # fmt: skip
    print(f"{'N':>2} {'M':>3} {'pipelined':>9} {'sharded':>8}  {'pipe/shard':>10} {'ideal':>6} "
          f"{'effic.':>6}")  # fmt: skip
    for n in args.stages_wait:
        for m in args.microbatches:
            data = batches(m, 4, 16)
            with ExitStack() as stack:
                runners = {
                    key: runtime_runner(
                        build(n, 16, 1, key == "shard", args.wait_ms / 1e3), data, stack
                    )  # fmt: skip
                    for key in ("piped", "shard")
                }
                row = interleaved_medians(runners, args.repeats)
            speedup, ideal = row["shard"] / row["piped"], n * m / (m + n - 1)
            print(f"{n:>2} {m:>3} {row['piped'] * 1e3:9.1f} {row['shard'] * 1e3:8.1f}  "
                  f"{speedup:9.2f}x {ideal:5.2f}x {speedup / ideal:6.0%}", flush=True)  # fmt: skip


@torch.fx.wrap
def wait_for(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """Identity that sleeps ``seconds``: a stage's kernel on an accelerator (an fx leaf)."""
    time.sleep(seconds)
    return x.clone()


class InferenceStage(nn.Module):
    """``layers`` Linear+ReLU of ``width``, or (``wait_s`` > 0) a wait of ``wait_s``."""

    def __init__(self, width: int, layers: int, wait_s: float = 0.0) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]
        )
        self.wait_s = wait_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return wait_for(x, self.wait_s) if self.wait_s else self.body(x)


def inference_model(num_stages: int, width: int, layers: int, wait_s: float = 0.0) -> nn.Module:
    """``num_stages`` stages, stage ``s`` in block ``s`` on IPU ``s``."""
    return nn.Sequential(
        *[
            poptorch.BeginBlock(InferenceStage(width, layers, wait_s), f"S{s}", ipu_id=s)
            for s in range(num_stages)
        ]
    )


def inference_runner(
    model: nn.Module, x: torch.Tensor, m: int, sharded: bool
) -> Callable[[], object]:
    """``poptorch.inferenceModel`` over ``m`` device iterations of one micro-batch each."""
    opts = poptorch.Options().deviceIterations(m)
    opts.setExecutionStrategy(
        poptorch.ShardedExecution() if sharded else poptorch.PipelinedExecution()
    )
    executor = poptorch.inferenceModel(model, opts)
    executor(x)  # compile
    return lambda: executor(x)


def plain_inference_runner(
    model: nn.Module, x: torch.Tensor, m: int, threads: int
) -> Callable[[], object]:
    """The same micro-batches through the model eagerly under ``no_grad`` on ``threads`` threads."""
    chunks = x.chunk(m)

    def run() -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with torch.no_grad():
                for chunk in chunks:
                    model(chunk)
        finally:
            torch.set_num_threads(previous)

    return run


INFERENCE_HEADER = (
    f"{'N':>2} {'M':>3} {'pipelined':>9} {'sharded':>8} {'plain':>8} {'plain-1t':>8}  "
    f"{'pipe/shard':>10} {'ideal':>6} {'effic.':>6} {'pipe/plain':>10} {'pipe/plain-1t':>13} "
    f"{'ceiling':>7}"
)


def measure_inference(args: argparse.Namespace) -> None:
    """Pipelined vs sharded vs plain inference through ``inferenceModel``, real compute."""
    print(f"\ninference (forward only), inferenceModel with deviceIterations(M), mb = {args.mb}, "
          f"stage = {args.layers_inf} x Linear({args.width_inf}) + ReLU")  # fmt: skip
    print(INFERENCE_HEADER)
    cores = os.cpu_count() or 1
    for n in args.stages:
        for m in args.microbatches:
            model = inference_model(n, args.width_inf, args.layers_inf)
            x = torch.randn(m * args.mb, args.width_inf)
            runners = {
                "piped": inference_runner(model, x, m, sharded=False),
                "shard": inference_runner(model, x, m, sharded=True),
                "plain": plain_inference_runner(model, x, m, cores),
                "plain1": plain_inference_runner(model, x, m, 1),
            }
            row = interleaved_medians(runners, args.repeats)
            ceiling, ideal = parallel_ceiling(matmuls=args.matmuls), n * m / (m + n - 1)
            speedup = row["shard"] / row["piped"]
            times = " ".join(
                f"{row[k] * 1e3:{w}.1f}"
                for k, w in (("piped", 9), ("shard", 8), ("plain", 8), ("plain1", 8))
            )
            print(f"{n:>2} {m:>3} {times}  {speedup:9.2f}x {ideal:5.2f}x {speedup / ideal:6.0%} "
                  f"{row['plain'] / row['piped']:9.2f}x {row['plain1'] / row['piped']:12.2f}x "
                  f"{ceiling:6.2f}x", flush=True)  # fmt: skip


def measure_inference_waiting(args: argparse.Namespace) -> None:
    """Pipelined vs sharded inference with stages that only wait: the schedule alone."""
    wait_ms = args.wait_ms_inf
    print(f"\ninference with stages that wait {wait_ms} ms per micro-batch (no compute)")
    print(f"{'N':>2} {'M':>3} {'pipelined':>9} {'sharded':>8}  {'pipe/shard':>10} {'ideal':>6} "
          f"{'effic.':>6} {'(M+N-1)*wait':>12}")  # fmt: skip
    for n in args.stages_wait:
        for m in args.microbatches_wait:
            model = inference_model(n, 16, 1, wait_ms / 1e3)
            x = torch.randn(m * 4, 16)
            runners = {
                key: inference_runner(model, x, m, sharded=key == "shard")
                for key in ("piped", "shard")
            }
            row = interleaved_medians(runners, args.repeats)
            speedup, ideal = row["shard"] / row["piped"], n * m / (m + n - 1)
            print(f"{n:>2} {m:>3} {row['piped'] * 1e3:9.1f} {row['shard'] * 1e3:8.1f}  "
                  f"{speedup:9.2f}x {ideal:5.2f}x {speedup / ideal:6.0%} "
                  f"{(m + n - 1) * wait_ms:12.1f}", flush=True)  # fmt: skip


def parallel_ceiling(threads: int = 2, matmuls: int = 40) -> float:
    """How much faster ``threads`` threads (one intra-op thread each) get through independent
    512x512 matmuls than one thread, right now: the best any pipeline can do on this machine."""

    def work(count: int) -> None:
        torch.get_num_threads()
        torch.set_num_threads(1)
        y = torch.randn(512, 512)
        for _ in range(count):
            y @ y

    def together() -> None:
        pool = [threading.Thread(target=work, args=(matmuls,)) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    previous = torch.get_num_threads()
    alone = interleaved_medians({"one": lambda: work(matmuls * threads), "all": together}, 3)
    torch.set_num_threads(previous)
    return alone["one"] / alone["all"]


def write_trace(args: argparse.Namespace) -> None:
    """One pipelined run (N=2, M=8) recorded as a Chrome trace, with the per-stage summary."""
    trace = TraceRecorder()
    program = build(2, args.width, args.layers, False)
    data = batches(8, args.mb, args.width, input_width(args.width))
    with PipelineRuntime(
        program, training=True, devices={0: CPU, 1: CPU}, threads_per_ipu=1, trace=trace
    ) as runtime:
        runtime.run(data)
        trace.clear()
        runtime.run(data)
    print(trace.timeline())
    print(trace.summary())
    trace.write(args.trace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--trace", help="write a Chrome trace of one N=2, M=8 pipelined run")
    parser.add_argument(
        "--only", choices=("training", "inference"), help="run only the training or inference rows"
    )
    args = parser.parse_args()
    quick = args.quick  # one row of each table, tiny stages, one repeat
    args.width, args.layers, args.mb = (64, 2, 8) if quick else (512, 2, 64)
    args.repeats = 1 if quick else 5
    args.stages = [2] if quick else [2, 4]
    args.microbatches = [4] if quick else [4, 8, 32]
    args.stages_wait = [2] if quick else [2, 4]
    args.wait_ms = 1 if quick else 2
    args.layers_inf = 3 if quick else 6
    args.width_inf = 64 if quick else 768
    args.microbatches_wait = [4] if quick else [16]
    args.wait_ms_inf = 2 if quick else 10
    args.matmuls = 4 if quick else 40  # of each parallel_ceiling() thread
    args.stage_repeats = 3 if quick else 50  # of each stage_costs() median
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, main intra-op threads "
        f"{torch.get_num_threads()}; stage = {args.layers} x Linear({args.width}) + ReLU, "
        f"mb = {args.mb}; median ms of {args.repeats} runs (fwd + bwd of M micro-batches); "
        f"plain = eager on {os.cpu_count()} intra-op threads, plain-1t = eager on one"
    )
    ceiling = parallel_ceiling(matmuls=args.matmuls)
    print(f"parallel ceiling now: 2 threads of matmuls run {ceiling:.2f}x one thread")
    if args.only != "inference":
        for n in args.stages:
            costs = ", ".join(f"{c:.2f}" for c in stage_costs(n, args, args.stage_repeats))
            print(f"N={n}: ms of fwd+bwd of one micro-batch per stage, one thread: {costs}")
        print(HEADER)
        measure(args)
        ceiling = parallel_ceiling(matmuls=args.matmuls)
        print(f"parallel ceiling now: 2 threads of matmuls run {ceiling:.2f}x one thread")
        measure_waiting(args)
    if args.only != "training":
        os.environ.setdefault("POPTORCH_SIM_THREADS_PER_IPU", "1")
        measure_inference(args)
        measure_inference_waiting(args)
    if args.trace:
        write_trace(args)


if __name__ == "__main__":
    main()
