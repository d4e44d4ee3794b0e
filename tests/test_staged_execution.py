"""Models with blocks through trainingModel / inferenceModel: pipelined and sharded on IPU
worker threads, against the eager PyTorch loop."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from oracle import expected_output, train_reference
from torch import nn

import poptorch_sim as poptorch


class TutorialLike(nn.Module):
    """Four blocks on two IPUs; a tensor from block B1 skips B2 and is used by B3."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 8 * 8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.head = nn.Linear(32, 10)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        with poptorch.Block("B1", ipu_id=0):
            h = torch.relu(self.conv(x)).flatten(1)
            skip = torch.relu(self.fc1(h))
        with poptorch.Block("B2", ipu_id=1):
            h2 = torch.relu(self.fc2(skip))
        with poptorch.Block("B3", ipu_id=1):
            out = self.head(torch.cat([h2, skip], dim=1))
        with poptorch.Block("B4", ipu_id=1):
            loss = self.loss(out, y)
        return out, loss


def _strategy(name: str):
    if name == "pipelined":
        return poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu)
    return poptorch.ShardedExecution()


@pytest.mark.parametrize("di", [1, 3], ids=lambda v: f"DI{v}")
@pytest.mark.parametrize("ga", [7, 16], ids=lambda v: f"GA{v}")
@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_staged_training_matches_eager(strategy: str, ga: int, di: int) -> None:
    model = TutorialLike()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(di).setExecutionStrategy(_strategy(strategy))
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.05))
    n = 2 * di * ga
    x, y = torch.randn(n, 1, 8, 8), torch.randint(0, 10, (n,))
    out, loss = training(x, y)
    assert type(training._executable.program).__name__ == "StagedRunner"
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    outs = train_reference(reference, ref_opt, (x, y), di, ga, 1)
    torch.testing.assert_close(
        out, expected_output(outs, poptorch.OutputMode.All, 1, lambda o: o[0])
    )
    torch.testing.assert_close(
        loss, expected_output(outs, poptorch.OutputMode.All, 1, lambda o: o[1])
    )
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    training.destroy()


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_staged_inference_matches_eager(strategy: str) -> None:
    model = TutorialLike()
    opts = poptorch.Options().deviceIterations(4).setExecutionStrategy(_strategy(strategy))
    inference = poptorch.inferenceModel(model, opts)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    out, loss = inference(x, y)
    with torch.no_grad():
        ref = [model(x[i : i + 2], y[i : i + 2]) for i in range(0, 8, 2)]
    torch.testing.assert_close(out, torch.cat([r[0] for r in ref]))
    torch.testing.assert_close(loss, torch.stack([r[1] for r in ref]))
    inference.destroy()


def test_pipeline_too_shallow_is_an_error() -> None:
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(TutorialLike(), opts)
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    with pytest.raises(poptorch.Error, match="gradientAccumulation must be greater than or equal"):
        training(x, y)


def test_profiling_writes_a_chrome_trace_per_model(tmp_path) -> None:
    opts = poptorch.Options().enableProfiling(str(tmp_path))
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(TutorialLike(), opts)
    training(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))
    training.destroy()
    (trace_file,) = tmp_path.glob("execution_trace_training_*.json")
    events = json.loads(trace_file.read_text())["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X"]
    assert {e["tid"] for e in complete} >= {0, 1}
    assert any(e["name"].startswith("optimizer step") for e in complete)


@pytest.mark.parametrize("clip", [None, 0.5], ids=["stage-steps", "global-clipping"])
def test_each_ipu_steps_its_own_weights_unless_clipping_is_global(tmp_path, clip) -> None:
    """See [Note: per-stage optimizer steps]: the step of IPU 1's weights runs on its worker."""
    model = TutorialLike()
    eager = copy.deepcopy(model)
    kwargs = {} if clip is None else {"max_grad_norm": clip}
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=0.01, **kwargs)
    opts = poptorch.Options().enableProfiling(str(tmp_path))
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    for _ in range(2):
        training(x, y)
    training.destroy()
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=0.01)
    for _ in range(2):
        train_reference(eager, eager_opt, (x, y), 1, 4, 1, clip=clip)
    for (name, ours), theirs in zip(model.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(ours, theirs, msg=name)
    (trace_file,) = tmp_path.glob("execution_trace_training_*.json")
    events = json.loads(trace_file.read_text())["traceEvents"]
    steps = [e["tid"] for e in events if e.get("name", "").startswith("optimizer step")]
    assert sorted(steps) == ([0, 0] if clip else [0, 0, 1, 1])


def test_set_optimizer_reaches_the_stage_steps() -> None:
    """setOptimizer's new learning rate is used by the steps that run on the IPU workers."""
    model = TutorialLike()
    eager = copy.deepcopy(model)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    for lr in (0.1, 0.01, 0.3):
        for group in optimizer.param_groups:
            group["lr"] = lr
        training.setOptimizer(optimizer)
        training(x, y)
        for group in eager_opt.param_groups:
            group["lr"] = lr
        train_reference(eager, eager_opt, (x, y), 1, 4, 1)
    assert training._executable.program.stage_step is not None
    for (name, ours), theirs in zip(model.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(ours, theirs, msg=name)
