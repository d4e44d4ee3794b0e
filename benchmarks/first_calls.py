"""The first twelve calls of a pipelined program: is it steady from the second call?

Rows: ``benchmarks/models.py``'s BERT and GPT-2, pipelined, training and inference (its sizes,
``--quick`` its tiny ones), and a 2-stage training pipeline whose stages sleep (10 ms per
forward, 20 per backward, ``--quick`` 2 and 4; 16 micro-batches: ``benchmarks/pipeline.py``'s
waiting stages) beside its sharded twin. Every program runs with the default way of sharing
the cores (the trials of [Note: cores follow the work] and [Note: trials that cost a fraction
of a call]).

Each row prints call 1 (which compiles) in seconds, calls 2-12 in ms, the steady call (the
median of calls 2-12), and ``max/steady``: the slowest of calls 2-12 over the steady call (the
goal: at most 1.5). ``modes`` gives each call's mode after its probe (s split, l lent, 1 one
thread, p side by side). The sleeping pipeline's ``x sharded`` is its sharded twin's median
call over its calls 2-4 and over calls 2-12 (ideal ``N*M / (M + N - 1)`` = 1.88).

Run: ``python benchmarks/first_calls.py [--quick] [--only bert,gpt2,sleep] [--calls 12]``
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline  # noqa: E402

from poptorch_sim.executor import placement  # noqa: E402
from poptorch_sim.runtime import PipelineRuntime  # noqa: E402

LETTER = {"split": "s", "lent": "l", "one thread": "1", "side by side": "p"}
WAIT_S, SLEEP_MB = 0.010, 16


def timed_calls(
    call: Callable[[], Any], mode: Callable[[], str], calls: int
) -> tuple[list[float], str]:
    """Each call's seconds, and the mode each ran in (after its probe)."""
    times, modes = [], ""
    for _ in range(calls):
        modes += LETTER.get(mode(), "?")
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times, modes


def model_row(name: str, quick: bool, training: bool, calls: int) -> None:
    import models  # transformers' import is slow: only for the model rows

    case = models.CASES[name]
    s = models.QUICK if quick else models.FULL
    s = dataclasses.replace(s, ga=max(s.ga, 2 * case.stages - 1))
    torch.manual_seed(0)
    model = case.build(s)
    batch = case.batch(s.micro * s.ga, s)
    if not training:
        labels = batch.pop("labels")
        if case.targets is not None:
            batch[case.targets] = labels
    call, sim = models.sim_call(case, model, batch, s, "pipelined", training)
    times, modes = timed_calls(
        call, lambda: placement(sim).mode if sim.isCompiled() else "lent", calls
    )
    sim.destroy()
    print_row(f"{case.name} {'train' if training else 'infer'}", times, modes)


def sleep_row(calls: int, wait_s: float = WAIT_S) -> None:
    data = pipeline.batches(SLEEP_MB, 4, 16)
    runtimes = {
        key: PipelineRuntime(pipeline.build(2, 16, 1, key == "sharded", wait_s), training=True)
        for key in ("pipelined", "sharded")
    }
    try:
        twin, _ = timed_calls(lambda: runtimes["sharded"].run(data), lambda: "one thread", calls)
        rt = runtimes["pipelined"]
        times, modes = timed_calls(lambda: rt.run(data), rt.cores.mode, calls)
    finally:
        for runtime in runtimes.values():
            runtime.close()
    sharded = statistics.median(twin[1:])
    early, steady = statistics.median(times[1:4]), statistics.median(times[1:])
    extra = f"{sharded / early:.2f}x / {sharded / steady:.2f}x sharded"
    print_row(f"sleeping 2 stages x {SLEEP_MB} mb", times, modes, extra)


def print_row(label: str, times: list[float], modes: str, extra: str = "") -> None:
    later = times[1:]
    steady = statistics.median(later)
    worst = max(range(len(later)), key=later.__getitem__)
    print(
        f"| {label} | {times[0]:.1f} | {' '.join(f'{t * 1e3:,.0f}' for t in later)} | "
        f"{steady * 1e3:,.0f} | {later[worst] / steady:.2f}x (call {worst + 2}) | {modes} | "
        f"{extra} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="models.py's tiny sizes, stages that sleep 2 ms"
    )
    parser.add_argument("--only", default="bert,gpt2,sleep", help="of bert, gpt2, sleep")
    parser.add_argument("--kinds", default="train,infer")
    parser.add_argument("--calls", type=int, default=12)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print(f"| program | call 1 s | calls 2-{args.calls} ms | steady ms | max/steady | modes | |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        if name == "sleep":
            sleep_row(args.calls, WAIT_S / 5 if args.quick else WAIT_S)
            continue
        for kind in args.kinds.split(","):
            model_row(name, args.quick, kind == "train", args.calls)


if __name__ == "__main__":
    main()
