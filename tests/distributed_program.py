r"""A PopRun-style program the distributed tests start as several processes (not a test module).

    python -m poptorch_sim.poprun --num-instances 2 --num-replicas 4 --ipus-per-replica 2 \
        tests/distributed_program.py train OUT_DIR [MNIST_DIR]
    ... distributed_program.py die       # instance 1 kills itself after its first step

``train`` writes ``OUT_DIR/instance<i>.pt``: popdist's answers, the dataset rows each model call
read, and the weights after training, for the test to compare with one process. Given
``MNIST_DIR``, it then runs the pipelining tutorial's ``main`` in the same instances (tiny
settings), which saves the test suite a second launch.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

import popdist
import popdist.poptorch
import poptorch

TUTORIAL = (
    Path(__file__).resolve().parent.parent / "tutorials" / "pipelining" / "mnist_pipeline.py"
)
# The tutorial's flags for a quick run: 2 training calls and 1 test call per instance, 2 loader
# workers per data loader (the tutorial's 16 would start 64 worker processes for 3 calls).
TUTORIAL_FLAGS = [
    "--epochs", "1", "--batch-size", "8", "--device-iterations", "2",
    "--gradient-accumulation", "8", "--test-batch-size", "8",
    "--max-train-samples", "512", "--max-test-samples", "256", "--num-workers", "2",
]  # fmt: skip
ROWS, FEATURES, OUTPUTS = 80, 6, 3
MICRO_BATCH = 2
SHUFFLE_SEED = 7


def dataset() -> torch.utils.data.TensorDataset:
    """The same rows in every process: inputs, targets and each row's index."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(ROWS, FEATURES, generator=gen)
    y = torch.randn(ROWS, OUTPUTS, generator=gen)
    return torch.utils.data.TensorDataset(x, y, torch.arange(ROWS))


class Plain(nn.Module):
    """Two linear layers and an MSE loss, on one IPU per replica."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 8)
        self.fc2 = nn.Linear(8, OUTPUTS)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, nn.functional.mse_loss(out, y)


class Piped(Plain):
    """The same layers cut into two blocks, pipelined over two IPUs per replica."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with poptorch.Block("B1"):
            h = torch.relu(self.fc1(x))
        with poptorch.Block("B2"):
            out = self.fc2(h)
            loss = nn.functional.mse_loss(out, y)
        return out, loss


def plain_options() -> poptorch.Options:
    """DI 2, GA 2, the launcher's local replicas; Mean reduction (the default)."""
    opts = popdist.poptorch.Options()
    opts.deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    return opts


def piped_options() -> poptorch.Options:
    """GA 4 over a two-stage pipeline, Sum reduction, shuffled data."""
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    opts.Training.gradientAccumulation(4)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    opts.randomSeed(SHUFFLE_SEED)
    opts.setExecutionStrategy(
        poptorch.PipelinedExecution(poptorch.Stage("B1").ipu(0), poptorch.Stage("B2").ipu(1))
    )
    return opts


def train(model: nn.Module, opts: poptorch.Options, optimizer, shuffle: bool) -> dict:
    """Train on this instance's shard; return the rows read and the final weights."""
    loader = poptorch.DataLoader(opts, dataset(), batch_size=MICRO_BATCH, shuffle=shuffle)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    rows = []
    for x, y, index in loader:
        training(x, y)
        rows.append(index.tolist())
    training.detachFromDevice()
    return {"rows": rows, "weights": {k: v.clone() for k, v in model.state_dict().items()}}


def run_train(out_dir: str) -> None:
    popdist.init()
    index = popdist.getInstanceIndex()
    torch.manual_seed(100 + index)  # different start weights: process 0's must win
    plain = Plain()
    result = {
        "popdist": {
            "isPopdistEnvSet": popdist.isPopdistEnvSet(),
            "getNumInstances": popdist.getNumInstances(),
            "getInstanceIndex": index,
            "getNumTotalReplicas": popdist.getNumTotalReplicas(),
            "getNumLocalReplicas": popdist.getNumLocalReplicas(),
            "getReplicaIndexOffset": popdist.getReplicaIndexOffset(),
            "getNumIpusPerReplica": popdist.getNumIpusPerReplica(),
        },
        "plain_options_process": (
            poptorch.Options().Distributed.processId,
            poptorch.Options().Distributed.numProcesses,
        ),
        "start": {k: v.clone() for k, v in plain.state_dict().items()},
        "plain": train(
            plain, plain_options(), poptorch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9),
            shuffle=False,
        ),
    }  # fmt: skip
    piped = Piped()
    result["piped_start"] = {k: v.clone() for k, v in piped.state_dict().items()}
    result["piped"] = train(
        piped, piped_options(), poptorch.optim.AdamW(piped.parameters(), lr=0.01), shuffle=True
    )
    path = os.path.join(out_dir, f"instance{index}.pt")
    popdist.execute_on_instances({index}, torch.save, result, path)


def run_tutorial(mnist_dir: str) -> None:
    """The pipelining tutorial's ``main``, as ``python mnist_pipeline.py`` would run it."""
    spec = importlib.util.spec_from_file_location("mnist_pipeline", TUTORIAL)
    assert spec is not None and spec.loader is not None
    tutorial = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tutorial)
    tutorial.main([*TUTORIAL_FLAGS, "--data-dir", mnist_dir])


def run_die() -> None:
    popdist.init()
    torch.manual_seed(0)
    model = Plain()
    opts = plain_options()
    training = poptorch.trainingModel(
        model, opts, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.01)
    )
    rows = MICRO_BATCH * 2 * 2 * popdist.getNumLocalReplicas()
    x, y = torch.randn(rows, FEATURES), torch.randn(rows, OUTPUTS)
    for step in range(1000):
        training(x, y)
        if step == 0 and popdist.getInstanceIndex() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        print(f"instance {popdist.getInstanceIndex()} step {step}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "train":
        run_train(sys.argv[2])
        if len(sys.argv) > 3:
            run_tutorial(sys.argv[3])
    elif mode == "die":
        run_die()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
