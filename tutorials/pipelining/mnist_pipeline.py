#!/usr/bin/env python3
"""Split a CNN over four IPUs and train it on MNIST, pipelined or sharded.

Run it with

    python mnist_pipeline.py --strategy pipelined --epochs 2
    python mnist_pipeline.py --strategy sharded --epochs 2

The network is cut into four blocks, ``B1`` to ``B4``, with ``poptorch.Block``; an execution
strategy then places each block on its own IPU. ``pipelined`` keeps all four IPUs busy with
different micro-batches at the same time (which needs gradient accumulation to fill the
pipeline); ``sharded`` runs one micro-batch at a time through the four IPUs in turn. The
README next to this file walks through both.

MNIST is read with torchvision from ``--data-dir``. Without network access a generated
MNIST-format stand-in is written there first; the program prints which data it uses.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torchvision
from torch import nn
from tqdm import tqdm

import poptorch
from poptorch_sim.datasets import ensure_mnist

# The same seed every run, so two runs print the same numbers.
torch.manual_seed(0)

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
BLOCKS = ("B1", "B2", "B3", "B4")


def mnist_split(args: argparse.Namespace, train: bool) -> torch.utils.data.Dataset:
    """One MNIST split as normalised ``[1, 28, 28]`` tensors, optionally cut short."""
    to_tensor = torchvision.transforms.Compose(
        [
            torchvision.transforms.ToTensor(),
            torchvision.transforms.Normalize((MNIST_MEAN,), (MNIST_STD,)),
        ]
    )
    dataset = torchvision.datasets.MNIST(
        args.data_dir, train=train, download=True, transform=to_tensor
    )
    limit = args.max_train_samples if train else args.max_test_samples
    if limit is not None and limit < len(dataset):
        dataset = torch.utils.data.Subset(dataset, range(limit))
    return dataset


def make_loaders(
    args: argparse.Namespace,
) -> tuple[poptorch.DataLoader, poptorch.DataLoader]:
    """Training and test loaders; each iteration yields the data of one model call."""
    # One training call consumes batch x device iterations x gradient accumulation samples
    # (40 x 10 x 10 = 4000 by default), whatever the execution strategy.
    train_opts = poptorch.Options()
    # Under PopRun each process shuffles the whole data set and reads its own block of it,
    # so every process must draw the same permutation: the seed says which.
    train_opts.randomSeed(0)
    train_opts.deviceIterations(args.device_iterations)
    train_opts.Training.gradientAccumulation(args.gradient_accumulation)
    training_data = poptorch.DataLoader(
        train_opts,
        mnist_split(args, train=True),
        batch_size=args.batch_size,
        shuffle=True,
        mode=poptorch.DataLoaderMode.Async,
        num_workers=args.num_workers,
    )
    # Inference has no gradient accumulation: run as many micro-batches per call as training.
    test_opts = poptorch.Options()
    test_opts.randomSeed(0)
    test_opts.deviceIterations(args.device_iterations * args.gradient_accumulation)
    test_data = poptorch.DataLoader(
        test_opts,
        mnist_split(args, train=False),
        batch_size=args.test_batch_size,
        shuffle=True,
        drop_last=True,
        mode=poptorch.DataLoaderMode.Async,
        num_workers=args.num_workers,
    )
    return training_data, test_data


class ConvPool(nn.Module):
    """Convolution, 2x2 max-pooling, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=kernel_size)
        self.pool = nn.MaxPool2d(kernel_size=2)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.pool(self.conv(x)))


class Network(nn.Module):
    """The classifier, annotated with the four blocks an execution strategy will place."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvPool(1, 10, kernel_size=5)  # 28x28 -> 12x12
        self.conv2 = ConvPool(10, 20, kernel_size=5)  # 12x12 -> 4x4
        self.fc1 = nn.Linear(20 * 4 * 4, 256)
        self.fc1_relu = nn.ReLU()
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Everything inside a `with poptorch.Block(...)` belongs to that block.
        with poptorch.Block("B1"):
            x = self.conv1(x)
        with poptorch.Block("B2"):
            x = self.conv2(x)
        with poptorch.Block("B3"):
            x = self.fc1_relu(self.fc1(x.flatten(start_dim=1)))
        with poptorch.Block("B4"):
            x = self.fc2(x)
        return x


class NetworkWithLoss(nn.Module):
    """Adds the loss to ``Network``; the loss joins the last block, ``B4``, again."""

    def __init__(self, network: Network) -> None:
        super().__init__()
        self.network = network
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.network(x)
        if labels is None:
            return logits
        # Re-entering an existing block id adds these operations to it: the loss is computed
        # on the IPU that holds B4, next to the logits it needs.
        with poptorch.Block("B4"):
            loss = self.criterion(logits, labels)
        return logits, loss


def accuracy(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """Percentage of rows of ``predictions`` whose arg-max matches the label.

    A training call returns only the last micro-batch's predictions (``OutputMode.Final``), so
    the labels used are the *last* ``len(predictions)`` of the batch.
    """
    labels = labels[-predictions.shape[0] :]
    hits = torch.eq(predictions.argmax(dim=1), labels).sum().item()
    return 100.0 * hits / labels.shape[0]


def one_block_per_ipu(strategy: str) -> poptorch.PipelinedExecution | poptorch.ShardedExecution:
    """``B1`` to ``B4`` on IPUs 0 to 3, one stage each."""
    stages = [poptorch.Stage(block).ipu(ipu) for ipu, block in enumerate(BLOCKS)]
    if strategy == "pipelined":
        return poptorch.PipelinedExecution(*stages)
    return poptorch.ShardedExecution(*stages)


def model_options(args: argparse.Namespace) -> poptorch.Options:
    """Options of the training model: execution strategy, tensor locations."""
    opts = poptorch.Options()
    opts._Popart.set("defaultPrefetchBufferingDepth", 3)
    opts.deviceIterations(args.device_iterations)
    opts.setExecutionStrategy(one_block_per_ipu(args.strategy))
    if args.strategy == "pipelined":
        # A pipeline of four stages needs at least 2 x 4 - 1 = 7 micro-batches in flight.
        opts.Training.gradientAccumulation(args.gradient_accumulation)
    # Sharded: the model keeps gradient accumulation 1 while the loader was built with it, so
    # each call carries gradient-accumulation times more micro-batch rows (400 instead of 40).
    if args.offload_optimiser:
        # Keep the optimizer state (AdamW's two moments) in off-chip streaming memory.
        opts.TensorLocations.setOptimizerLocation(
            poptorch.TensorLocationSettings().useOnChipStorage(False)
        )
    return opts


def train(training_model: poptorch.PoplarExecutor, training_data, epochs: int) -> None:
    """Run ``epochs`` passes over ``training_data``, showing loss and accuracy."""
    for epoch in range(1, epochs + 1):
        print(f"Epoch {epoch}/{epochs}")
        bar = tqdm(training_data, total=len(training_data))
        for images, labels in bar:
            predictions, losses = training_model(images, labels)
            loss = torch.mean(losses).item()
            bar.set_description(
                f"Loss:{loss:0.4f} | Accuracy:{accuracy(predictions, labels):0.2f}%"
            )


def test(inference_model: poptorch.PoplarExecutor, test_data) -> float:
    """Mean accuracy over the test loader's calls; prints and returns it."""
    total = 0.0
    for images, labels in tqdm(test_data, total=len(test_data)):
        total += accuracy(inference_model(images), labels)
    result = total / max(len(test_data), 1)
    print(f"Accuracy on test set: {result:0.2f}%")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MNIST over four IPUs with PopTorch")
    add = parser.add_argument
    add("--batch-size", type=int, default=40, help="training micro-batch size (default: 40)")
    add("--device-iterations", type=int, default=10, help="device iterations (default: 10)")
    add(
        "--gradient-accumulation",
        type=int,
        default=10,
        help="micro-batches per step (default: 10)",
    )
    add("--test-batch-size", type=int, default=8, help="test micro-batch size (default: 8)")
    add("--epochs", type=int, default=3, help="training epochs (default: 3)")
    add("--learning-rate", type=float, default=0.001, help="AdamW learning rate (default: 0.001)")
    add("--profile", action="store_true", help="write an execution profile (default: off)")
    add("--profile-dir", default="./profile", help="profile directory (default: ./profile)")
    add("--strategy", choices=["pipelined", "sharded"], default="pipelined", help="how to split")
    add("--offload-optimiser", action="store_true", help="keep optimizer state off-chip")
    add("--debug", action="store_true", help="print PopTorch's debug log")
    add("--data-dir", default="~/.torch/datasets", help="MNIST root (default: ~/.torch/datasets)")
    # For quick smoke runs (CI): train and test on the first N samples only.
    add("--max-train-samples", type=int, default=None, help=argparse.SUPPRESS)
    add("--max-test-samples", type=int, default=None, help=argparse.SUPPRESS)
    add("--num-workers", type=int, default=16, help=argparse.SUPPRESS)  # per data loader
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    if args.debug:
        poptorch.setLogLevel(1)  # DEBUG
    ensure_mnist(args.data_dir)
    training_data, test_data = make_loaders(args)

    network = Network()
    opts = model_options(args)
    if args.profile:
        print("Profiling is enabled.")
        report = {"autoReport.all": "true", "autoReport.directory": args.profile_dir}
        os.environ["POPLAR_ENGINE_OPTIONS"] = json.dumps(report)
    training_model = poptorch.trainingModel(
        NetworkWithLoss(network),
        opts,
        optimizer=poptorch.optim.AdamW(network.parameters(), lr=args.learning_rate),
    )
    print("Training...")
    train(training_model, training_data, args.epochs)

    # Inference reuses the training placement. Options given to a model are frozen, so clone
    # them; one inference call covers as many micro-batches as one training call did.
    inference_opts = opts.clone()
    inference_opts.Training.gradientAccumulation(1)
    inference_opts.deviceIterations(args.device_iterations * args.gradient_accumulation)
    inference_model = poptorch.inferenceModel(network, inference_opts)
    # Both executors share `network`'s weights; release the training IPUs before testing.
    training_model.detachFromDevice()
    print("Testing...")
    result = test(inference_model, test_data)
    inference_model.detachFromDevice()
    return result


if __name__ == "__main__":
    main()
