#!/usr/bin/env python3
"""How fast would it be on IPUs? The predicted time of a BERT pipeline, and a faster split.

Run it with

    python ipu_time.py                      # a 12-layer BERT on 4 IPUs, Mk2 and Bow
    python ipu_time.py --plot-dir ./plots   # also draw each step as a Gantt chart

The question after "does it fit" is "how fast": how many samples a second the program would
train at on IPUs, which IPU holds the pipeline back, and what a better split would gain.
``poptorch_sim.time_report(model)`` answers it from the compiled program, without running it:
the FLOPs and bytes of each stage's ops, PopART's pipeline schedule (GA + 2(N - 1) cycles a
step), recomputation, the weight update, the all-reduce over replicas and the host IO, on the
constants of a Mk2 or a Bow IPU and two efficiencies fitted on Graphcore's MLPerf results
(``benchmarks/ipu_time.py``). Every figure is a prediction.

1. A BERT (hidden 768, 12 layers) is split the way a first attempt often is: one block per IPU
   starting at layers 0, 2, 4 and 6, which leaves six layers and the head on the last IPU.
   It is compiled for an offline Mk2 target (``useOfflineIpuTarget(2)``: nothing runs) and its
   time report printed: the last IPU is the bottleneck, the others idle.
2. ``poptorch_sim.timing.plan_time`` profiles the layers once, costs each in predicted IPU
   seconds and proposes the split that minimises the slowest stage among those that fit, with
   its predicted speedup over the user's.
3. The suggested blocks are applied, the model compiled again, and the two reports compared;
   then the same program on a Bow IPU (``useOfflineIpuTarget(21)``).
4. ``opts.logCycleCount(True)`` and a real (simulated) call: ``model.cycleCount()`` returns the
   predicted cycles of that call, as PopART would count them on hardware.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import transformers

import poptorch
import poptorch_sim
from poptorch_sim.timing import plan_time

torch.manual_seed(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--ga", type=int, default=16, help="gradient accumulation")
    parser.add_argument("--plot-dir", help="draw each step into this folder")
    return parser.parse_args(argv)


def build(
    args: argparse.Namespace, starts: list[int]
) -> transformers.BertForSequenceClassification:
    """BERT with a block starting at each of ``starts`` (IPU k at layer ``starts[k]``)."""
    config = transformers.BertConfig(
        hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64), intermediate_size=4 * args.hidden,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    for ipu, layer in enumerate(starts):
        poptorch.BeginBlock(model.bert.encoder.layer[layer], f"IPU{ipu}", ipu_id=ipu)
    return model


def options(args: argparse.Namespace, version: int | None = 2) -> poptorch.Options:
    opts = poptorch.Options()
    if version is not None:
        opts.useOfflineIpuTarget(version)
    opts.Training.gradientAccumulation(args.ga)
    opts.showCompilationProgressBar(False)
    return opts


def batch(args: argparse.Namespace, micro_batches: int) -> dict[str, torch.Tensor]:
    n = args.micro_batch * micro_batches
    ids = torch.randint(0, 30522, (n, args.seq))
    return {"input_ids": ids, "labels": torch.randint(0, 2, (n,))}


def predicted(model: Any, opts: poptorch.Options, args: argparse.Namespace) -> Any:
    """Compile ``model`` for a training step (nothing runs) and return its time report."""
    training = poptorch.trainingModel(model, opts, poptorch.optim.AdamW(model.parameters()))
    training.compile(**batch(args, args.ga))
    report = poptorch_sim.time_report(training)
    training.destroy()  # unwrap, so that the model can be wrapped again
    return report


def show(title: str, report: Any, args: argparse.Namespace, name: str) -> None:
    print(f"\n=== {title}")
    print(report)
    if args.plot_dir:
        os.makedirs(args.plot_dir, exist_ok=True)
        print(f"Gantt chart: {report.plot(os.path.join(args.plot_dir, name + '.png'))}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    user = [0, 2, 4, 6]
    first = predicted(build(args, user), options(args), args)
    show(f"your split (layers {user}), Mk2", first, args, "user_mk2")

    model = build(args, user)
    one = batch(args, 1)
    suggestion = plan_time(model, one, options(args), len(user), optimizer="adamw")
    print("\n=== the planner, by predicted time")
    print(suggestion)
    suggestion.apply(model)
    second = predicted(model, options(args), args)
    show(f"suggested split ({suggestion.blocks}), Mk2", second, args, "planned_mk2")
    gain = first.run_seconds / second.run_seconds
    print(f"\npredicted step: {1e3 * first.run_seconds:.2f} ms -> {1e3 * second.run_seconds:.2f} "
          f"ms, {gain:.2f}x as fast ({first.bottleneck} -> {second.bottleneck})")  # fmt: skip

    bow = predicted(model, options(args, 21), args)
    show("suggested split, Bow", bow, args, "planned_bow")
    print(f"\nBow over Mk2: {bow.samples_per_second / second.samples_per_second:.2f}x "
          f"(clock ratio {bow.clock_hz / second.clock_hz:.2f})")  # fmt: skip

    opts = options(args, None).logCycleCount(True)
    training = poptorch.trainingModel(model, opts, poptorch.optim.AdamW(model.parameters()))
    training(**batch(args, args.ga))
    print(
        f"\ncycleCount() after one call: {training.cycleCount():,} cycles "
        f"(a prediction: {training.cycleCount() / second.clock_hz * 1e3:.2f} ms on Mk2)"
    )


if __name__ == "__main__":
    main()
