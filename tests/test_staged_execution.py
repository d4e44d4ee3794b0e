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


class TiedLM(nn.Module):
    """A GPT-2-like tiny LM: the token embedding and the LM head share one weight, so the head is
    placed back on the embedding's IPU: blocks on IPUs 0, 1, 0."""

    def __init__(self, vocab: int = 16, dim: int = 8, seq: int = 6) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU())
        self.proj = nn.Linear(2 * dim, dim)
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor, labels: torch.Tensor):
        with poptorch.Block("Embedding", ipu_id=0):
            positions = torch.arange(ids.shape[1], device=ids.device)
            h = self.wte(ids) + self.wpe(positions)
        with poptorch.Block("Layer", ipu_id=1):
            h = h + self.proj(self.mlp(h))
        with poptorch.Block("LM head", ipu_id=0):
            logits = self.lm_head(self.ln_f(h))
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return logits, loss


def _same_as_ipu(name: str):
    if name == "pipelined":
        return poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu)
    return poptorch.ShardedExecution(poptorch.AutoStage.SameAsIpu)


def test_sharded_training_returns_to_an_earlier_ipu_like_eager() -> None:
    model = TiedLM()
    reference = copy.deepcopy(model)
    di, ga = 2, 2
    opts = poptorch.Options().deviceIterations(di).setExecutionStrategy(_same_as_ipu("sharded"))
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.5))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for _ in range(2):
        ids, labels = (
            torch.randint(0, 16, (2 * di * ga, 6)),
            torch.randint(0, 16, (2 * di * ga, 6)),
        )
        out, loss = training(ids, labels)
        outs = train_reference(reference, ref_opt, (ids, labels), di, ga, 1)
        all_ = poptorch.OutputMode.All
        torch.testing.assert_close(out, expected_output(outs, all_, 1, lambda o: o[0]))
        torch.testing.assert_close(loss, expected_output(outs, all_, 1, lambda o: o[1]))
        for name, param in reference.named_parameters():
            torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    stages = training._executable.program.program.stages
    assert [s.ipu for s in stages] == [0, 1, 0]
    assert model.lm_head.weight is model.wte.weight
    training.destroy()


def test_sharded_inference_returns_to_an_earlier_ipu_like_eager() -> None:
    model = TiedLM().eval()
    opts = poptorch.Options().deviceIterations(3).setExecutionStrategy(_same_as_ipu("sharded"))
    inference = poptorch.inferenceModel(model, opts)
    ids, labels = torch.randint(0, 16, (6, 6)), torch.randint(0, 16, (6, 6))
    out, loss = inference(ids, labels)
    with torch.no_grad():
        ref = [model(ids[i : i + 2], labels[i : i + 2]) for i in range(0, 6, 2)]
    torch.testing.assert_close(out, torch.cat([r[0] for r in ref]))
    torch.testing.assert_close(loss, torch.stack([r[1] for r in ref]))
    assert [s.ipu for s in inference._executable.program.program.stages] == [0, 1, 0]
    inference.destroy()


def test_a_pipeline_must_not_return_to_an_earlier_stage() -> None:
    opts = poptorch.Options().setExecutionStrategy(_same_as_ipu("pipelined"))
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(TiedLM(), opts)
    ids = torch.randint(0, 16, (8, 6))
    with pytest.raises(poptorch.Error, match="which is computed later in the pipeline"):
        training(ids, ids)
