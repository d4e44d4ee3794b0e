#!/usr/bin/env python3
"""Train a small CNN on MNIST on one (simulated) IPU with PopTorch, then measure test accuracy.

A complete PopTorch program that runs unmodified on IPUs and on poptorch_sim:

    python tutorials/single_ipu/train_mnist.py --epochs 1

The points it shows:

* the loss is computed *inside* the model, which returns ``(output, loss)`` when given labels;
* ``poptorch.DataLoader`` hands out one model call's worth of data per iteration, i.e.
  ``batch_size x deviceIterations x gradientAccumulation`` samples;
* one ``trainingModel`` call runs ``deviceIterations`` optimizer steps, each over
  ``gradientAccumulation`` micro-batches, and by default returns only the last micro-batch's
  output (``OutputMode.Final``), so labels are lined up with the *end* of the batch;
* ``inferenceModel`` over the same network shares the trained weights.

MNIST is read with torchvision; without network access a generated MNIST-format stand-in is
used instead (the program says which).
"""

from __future__ import annotations

import argparse

import torch
import torchvision
from torch import nn
from tqdm import tqdm

import poptorch
from poptorch_sim.datasets import ensure_mnist

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class Classifier(nn.Module):
    """Two small convolutions and two fully connected layers (about 30k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, 10)
        )
        self.loss = nn.CrossEntropyLoss()

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.head(self.features(images))
        if labels is None:
            return logits
        return logits, self.loss(logits, labels)


def mnist(data_dir: str, train: bool) -> torchvision.datasets.MNIST:
    """The MNIST split under ``data_dir``, as normalised tensors."""
    transform = torchvision.transforms.Compose(
        [
            torchvision.transforms.ToTensor(),
            torchvision.transforms.Normalize((MNIST_MEAN,), (MNIST_STD,)),
        ]
    )
    return torchvision.datasets.MNIST(data_dir, train=train, download=True, transform=transform)


def train(args: argparse.Namespace, model: Classifier) -> poptorch.PoplarExecutor:
    """Train ``model`` for ``args.epochs`` epochs (or ``args.max_steps`` calls); return the executor."""
    opts = poptorch.Options()
    opts.deviceIterations(args.device_iterations)
    opts.Training.gradientAccumulation(args.gradient_accumulation)
    loader = poptorch.DataLoader(
        opts, mnist(args.data_dir, train=True), batch_size=args.batch_size, shuffle=True
    )
    optimizer = poptorch.optim.Adam(model.parameters(), lr=args.learning_rate)
    training_model = poptorch.trainingModel(model, opts, optimizer=optimizer)
    calls = 0
    for epoch in range(1, args.epochs + 1):
        bar = tqdm(loader, desc=f"Epoch {epoch}/{args.epochs}")
        for images, labels in bar:
            logits, loss = training_model(images, labels)
            # OutputMode.Final: only the last micro-batch's logits come back.
            hits = (logits.argmax(1) == labels[-logits.shape[0] :]).float().mean()
            bar.set_postfix_str(f"Loss:{loss.mean().item():0.4f} | Accuracy:{100 * hits:0.2f}%")
            calls += 1
            if args.max_steps is not None and calls >= args.max_steps:
                return training_model
    return training_model


def evaluate(args: argparse.Namespace, model: Classifier) -> float:
    """Accuracy (%) of ``model`` on the test split, computed with an inference executor."""
    opts = poptorch.Options().deviceIterations(args.device_iterations)
    loader = poptorch.DataLoader(
        opts, mnist(args.data_dir, train=False), batch_size=args.test_batch_size
    )
    inference_model = poptorch.inferenceModel(model, opts)
    correct = seen = 0
    for images, labels in tqdm(loader, desc="Testing"):
        predictions = inference_model(images).argmax(1)
        correct += int((predictions == labels).sum())
        seen += labels.numel()
    inference_model.detachFromDevice()
    return 100.0 * correct / max(seen, 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Single-IPU MNIST training with PopTorch")
    parser.add_argument("--epochs", type=int, default=1, help="training epochs (default: 1)")
    parser.add_argument(
        "--batch-size", type=int, default=16, help="micro-batch size (default: 16)"
    )
    parser.add_argument(
        "--device-iterations", type=int, default=50, help="device iterations (default: 50)"
    )
    parser.add_argument(
        "--gradient-accumulation", type=int, default=1, help="micro-batches per step (default: 1)"
    )
    parser.add_argument(
        "--test-batch-size", type=int, default=100, help="test micro-batch size (default: 100)"
    )
    parser.add_argument(
        "--learning-rate", type=float, default=0.001, help="Adam lr (default: 0.001)"
    )
    parser.add_argument(
        "--data-dir", default="~/.torch/datasets", help="MNIST root (default: ~/.torch/datasets)"
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="stop training after this many model calls"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    torch.manual_seed(0)
    ensure_mnist(args.data_dir)
    model = Classifier()
    training_model = train(args, model)
    # The host model's weights are refreshed from the device on first access, so the inference
    # executor below starts from the trained weights.
    training_model.detachFromDevice()
    accuracy = evaluate(args, model)
    print(f"Accuracy on test set: {accuracy:0.2f}%")
    return accuracy


if __name__ == "__main__":
    main()
