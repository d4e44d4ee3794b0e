"""Manual sharding: what PopRT's rule costs at compile time, and what the cut points cost per step.

1. Compile-time cost, on the two capture front ends: ResNet-50 (torch.fx) and a BERT-base-sized
   ``BertForSequenceClassification`` (12 layers, hidden 768; torch.export), each with three split
   points: the capture (``capture_model``) against PopRT's assignment (``assign``) on that graph.
2. Per-step time of ResNet-50 training (one optimizer step over ``GA`` micro-batches, SGD): the
   eager PyTorch loop on the main thread, then the model split over 4 simulated IPUs and
   pipelined, at PopRT's example cut points and at the last adds of ``layer1``, ``layer2`` and
   ``layer3``. Ratios are against the eager loop of the same run.

[Note: the eager baseline runs on one thread]
Each IPU worker runs its ops on one intra-op thread. Eager PyTorch with two OpenMP threads is
the fair baseline on an idle two-core machine, but on a shared one it collapses: with a load
average of 12 on 2 cores, one eager ResNet-50 step (64x64, 8 micro-batches of 2) took 80 s on
two threads and 6-7.6 s on one, because every parallel region waits at a barrier for a thread
the OS has descheduled (see [Note: per-thread intra-op threads] in
``poptorch_sim/runtime/intra_op.py``). So the baseline here is eager on one thread; the four IPU
workers share the main thread's two threads, one each at most.

Medians of interleaved repeats, after one warm-up call (which compiles). On a machine whose
cores are shared, wall-clock figures move with the load: compare ratios within one run.

Run: ``.venv/bin/python benchmarks/sharding.py [--image-size 64] [--repeats 3] [--skip-bert] [--quick]``
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torchvision.models.resnet import Bottleneck, ResNet

import poptorch_sim as poptorch
from poptorch_sim.compiler import capture_model
from poptorch_sim.compiler.sharding import ShardingConfig, assign

POPRT_CUT = {"add": 0, "layer4_0_bn3": 1, "add_13": 2}
LAYER_END_CUT = {"add_2": 0, "add_6": 1, "add_12": 2}


class SlimBottleneck(Bottleneck):
    """A bottleneck of half the expansion; with ``width_per_group=16`` it gives ResNet-50's graph
    and node names at a ninth of its parameters (``--quick``)."""

    expansion = 2


class ResNet50WithLoss(ResNet):
    """ResNet-50 returning (logits, loss), with plain ``resnet50()``'s node names; ``slim``:
    narrower layers (``SlimBottleneck``), the same graph."""

    def __init__(self, slim: bool = False) -> None:
        if slim:
            super().__init__(SlimBottleneck, [3, 4, 6, 3], num_classes=10, width_per_group=16)
        else:
            super().__init__(Bottleneck, [3, 4, 6, 3], num_classes=10)
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, images: torch.Tensor, labels: torch.Tensor):  # type: ignore[override]
        logits = super().forward(images)
        return logits, self.criterion(logits, labels)


def _median(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compile_cost(repeats: int, skip_bert: bool, slim: bool = False) -> None:
    """Section 1: capture vs PopRT's assignment."""
    cases: list[tuple[str, nn.Module, tuple, dict, dict[str, int]]] = []
    images, labels = torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))
    name = "ResNet-50 slim (fx)" if slim else "ResNet-50 (fx)"
    cases.append((name, ResNet50WithLoss(slim), (images, labels), {}, POPRT_CUT))
    if not skip_bert:
        from transformers import BertConfig, BertForSequenceClassification

        bert = BertForSequenceClassification(BertConfig(num_labels=3))  # 12 x 768, random init
        ids, tags = torch.randint(0, 1000, (2, 128)), torch.randint(0, 3, (2,))
        kwargs = {"input_ids": ids, "labels": tags}
        splits = {"layer_norm_8": 0, "layer_norm_16": 1, "layer_norm_24": 2}  # layers 4, 8, 12
        cases.append(("BERT-base (export)", bert, (), kwargs, splits))
    print(f"{'model':<20} {'ops':>5} {'capture s':>10} {'assign ms':>10} {'assign/capture':>15}")
    for name, model, args, kwargs, splits in cases:
        config = ShardingConfig.from_info(splits, splits)
        trace = capture_model(model, args, kwargs)
        capture = _median(functools.partial(capture_model, model, args, kwargs), repeats)
        assigning = _median(functools.partial(assign, trace, config), max(repeats, 5))
        ops = len(assign(trace, config).shard_of)
        print(
            f"{name:<20} {ops:>5} {capture:>10.2f} {assigning * 1e3:>10.2f} "
            f"{assigning / capture:>15.4f}"
        )


def _eager_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ga: int) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # See [Note: the eager baseline runs on one thread]
        try:
            optimizer.zero_grad()
            for xs, ys in zip(x.chunk(ga), y.chunk(ga)):
                (model(xs, ys)[1] / ga).backward()
            optimizer.step()
        finally:
            torch.set_num_threads(threads)

    return step


def _sharded_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, ga: int, cut: dict[str, int]
) -> tuple[Callable[[], None], Any]:
    poptorch.Sharder(cut, cut).run(model, x[: len(x) // ga], y[: len(y) // ga])
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(ga)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    return lambda: training(x, y), training


def step_time(image_size: int, mb: int, ga: int, repeats: int, slim: bool = False) -> None:
    """Section 2: eager vs the two cuts, pipelined on 4 IPUs."""
    torch.manual_seed(0)
    base = ResNet50WithLoss(slim)
    x = torch.randn(mb * ga, 3, image_size, image_size)
    y = torch.randint(0, 10, (mb * ga,))
    runs = {"eager, 1 thread": _eager_step(copy.deepcopy(base), x, y, ga)}
    models = []
    for name, cut in (("PopRT cut, 4 IPUs", POPRT_CUT), ("layer-end cut, 4 IPUs", LAYER_END_CUT)):
        runs[name], training = _sharded_step(copy.deepcopy(base), x, y, ga, cut)
        models.append(training)
    for run in runs.values():
        run()  # warm-up; compiles the sharded models
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    eager = statistics.median(times["eager, 1 thread"])
    print(f"ResNet-50{' slim' if slim else ''}, {image_size}x{image_size}, micro-batch {mb}, "
          f"GA {ga}, {repeats} repeats")  # fmt: skip
    print(f"{'run':<20} {'s/step':>8} {'vs eager':>9}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<20} {median:>8.2f} {eager / median:>8.2f}x")
    for training in models:
        training.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--gradient-accumulation", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-bert", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="32x32 images, one repeat, no BERT, slim ResNet-50"
    )
    args = parser.parse_args()
    if args.quick:
        args.image_size, args.repeats = 32, 1
        args.skip_bert = True
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    compile_cost(args.repeats, args.skip_bert, slim=args.quick)
    step_time(
        args.image_size, args.micro_batch, args.gradient_accumulation, args.repeats, args.quick
    )


if __name__ == "__main__":
    main()
