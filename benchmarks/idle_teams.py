"""The caller's own eager ops beside a model whose IPU workers computed on several threads.

A thread's OpenMP team keeps its threads after its parallel regions; with more pooled threads in
the process than CPUs, libgomp makes every team sleep at its barriers instead of spinning, the
caller's eager ops included (see [Note: idle teams slow every team] in
``poptorch_sim/runtime/intra_op.py``). IPU workers free their team when they go idle. Each round
times the caller's loop of 512-wide linears (64 rows, 10 micro-batches; median of 9) with no
model, then beside a sharded 4-IPU model (every worker on every core) after 4 calls, once with
the workers freeing their teams (the default) and once keeping them (the release disabled);
medians over the rounds, ratio against the loop with no model.

Run: ``python benchmarks/idle_teams.py [--quick] [--rounds N]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import poptorch_sim as poptorch  # noqa: E402
from poptorch_sim.kernels.simd_choice import cpu_model  # noqa: E402
from poptorch_sim.runtime import worker  # noqa: E402


class Layers(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for ipu, layer in enumerate(self.layers):
            with poptorch.Block(ipu_id=ipu):
                x = torch.relu(layer(x))
        return x


def caller_loop_ms(model: nn.Module, x: torch.Tensor, micro: int, repeats: int) -> float:
    """Median ms of the caller's eager loop over the micro-batches of ``x``."""
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            for part in x.split(micro):
                model(part)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def beside_a_model(model: nn.Module, x: torch.Tensor, micro: int, repeats: int) -> float:
    """The caller's loop after 4 calls of the model sharded over 4 IPUs."""
    opts = poptorch.Options().deviceIterations(x.shape[0] // micro)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts.showCompilationProgressBar(False)
    sim = poptorch.inferenceModel(model, opts)
    for _ in range(4):
        sim(x)
    try:
        return caller_loop_ms(model, x, micro, repeats)
    finally:
        sim.destroy()  # joins the workers: their teams go with them


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, width 128, one repeat")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    width, micro, repeats = (128, 16, 1) if args.quick else (512, 64, 9)
    rounds = 1 if args.quick else args.rounds
    torch.manual_seed(0)
    model = Layers(width).eval()
    x = torch.randn(10 * micro, width)
    alone, freed, kept = [], [], []
    for _ in range(rounds):
        alone.append(caller_loop_ms(model, x, micro, repeats))
        freed.append(beside_a_model(model, x, micro, repeats))
        with mock.patch.object(worker, "release_team", lambda: None):
            kept.append(beside_a_model(model, x, micro, repeats))
    a, f, k = (statistics.median(v) for v in (alone, freed, kept))
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), torch {torch.__version__}, ", end="")
    print(f"{torch.get_num_threads()} threads; medians of {rounds} rounds")
    print("| the caller's loop | ms | vs no model |")
    print("|---|---|---|")
    print(f"| no model | {a:.2f} | 1.00x |")
    print(f"| beside the model, its workers' teams freed (default) | {f:.2f} | {f / a:.2f}x |")
    print(f"| beside the model, its workers' teams kept | {k:.2f} | {k / a:.2f}x |")


if __name__ == "__main__":
    main()
