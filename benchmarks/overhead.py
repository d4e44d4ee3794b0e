#!/usr/bin/env python3
"""What ``trainingModel`` costs on one simulated IPU, against the plain PyTorch loop it stands for.

Both sides train the same MNIST-size CNN on the same tensors with the same optimizer settings
and the same number of intra-op threads; only the driver differs:

* eager: ``for micro-batch: forward, loss, backward, optimizer.step()``;
* poptorch: ``trainingModel`` with ``deviceIterations(D)`` and gradient accumulation 1, so one
  call runs the same D optimizer steps over D micro-batches.

The two alternate within every repeat, so load from other processes hits both alike. It prints
each side's median throughput and their ratio (poptorch / eager; 1.0 means no overhead):

    python benchmarks/overhead.py            # full run
    python benchmarks/overhead.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

import poptorch_sim as poptorch


class SmallCNN(nn.Module):
    """The pipelining tutorial's classifier, without blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 10, 5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(10, 20, 5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(320, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class WithLoss(nn.Module):
    """PopTorch's convention: the model computes and returns its loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(x)
        return out, self.loss(out, labels)


def make_data(calls: int, rows_per_call: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``calls`` host batches of MNIST-shaped random images and labels (fixed seed)."""
    gen = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(rows_per_call, 1, 28, 28, generator=gen),
            torch.randint(10, (rows_per_call,), generator=gen),
        )
        for _ in range(calls)
    ]


def eager_epoch(
    model: nn.Module, optimizer: torch.optim.Optimizer, data, micro_batch: int
) -> None:
    """The plain PyTorch loop over every micro-batch of ``data``."""
    criterion = nn.CrossEntropyLoss()
    for images, labels in data:
        for start in range(0, images.shape[0], micro_batch):
            x, y = images[start : start + micro_batch], labels[start : start + micro_batch]
            optimizer.zero_grad(set_to_none=True)
            criterion(model(x), y).backward()
            optimizer.step()


def poptorch_epoch(training_model, data) -> None:
    """One ``trainingModel`` call per host batch of ``data``."""
    for images, labels in data:
        training_model(images, labels)


def timed(fn, samples: int) -> float:
    """Samples per second of one run of ``fn()``."""
    start = time.perf_counter()
    fn()
    return samples / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description="trainingModel overhead vs eager PyTorch")
    parser.add_argument("--quick", action="store_true", help="small run (a few seconds)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default: 1)")
    parser.add_argument("--micro-batch", type=int, default=32, help="micro-batch (default: 32)")
    parser.add_argument("--device-iterations", type=int, default=10, help="default: 10")
    parser.add_argument("--calls", type=int, default=None, help="calls per repeat")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (default: 7)")
    args = parser.parse_args(argv)
    calls = args.calls or (3 if args.quick else 20)
    repeats = args.repeats or (3 if args.quick else 7)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    rows = args.micro_batch * args.device_iterations
    data = make_data(calls, rows)
    samples = calls * rows
    eager_model = SmallCNN()
    sim_model = copy.deepcopy(eager_model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.01, momentum=0.9)
    opts = poptorch.Options().deviceIterations(args.device_iterations)
    sim_opt = poptorch.optim.SGD(sim_model.parameters(), lr=0.01, momentum=0.9)
    training_model = poptorch.trainingModel(WithLoss(sim_model), opts, optimizer=sim_opt)

    # Warm-up (and, for poptorch, compilation) outside the measurements.
    eager_epoch(eager_model, eager_opt, data[:1], args.micro_batch)
    poptorch_epoch(training_model, data[:1])

    eager_rates, sim_rates = [], []
    for _ in range(repeats):
        eager_rates.append(
            timed(lambda: eager_epoch(eager_model, eager_opt, data, args.micro_batch), samples)
        )
        sim_rates.append(timed(lambda: poptorch_epoch(training_model, data), samples))
    eager, sim = statistics.median(eager_rates), statistics.median(sim_rates)
    ratio = sim / eager
    print(
        f"threads={args.threads} micro-batch={args.micro_batch} "
        f"deviceIterations={args.device_iterations} calls={calls} repeats={repeats}"
    )
    print(f"eager PyTorch      : {eager:10.1f} samples/s (median)")
    print(f"poptorch (1 IPU)   : {sim:10.1f} samples/s (median)")
    print(f"ratio poptorch/eager: {ratio:0.3f} (target >= 0.95)")
    training_model.destroy()
    return ratio


if __name__ == "__main__":
    main()
