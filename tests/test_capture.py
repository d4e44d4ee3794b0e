"""The two capture front ends (torch.fx, torch.export) behind one Trace: which one runs, block
membership surviving each, and models only torch.export can capture, against eager PyTorch."""

from __future__ import annotations

import copy

import pytest
import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.compiler.capture import capture_model


class ShapeBranch(nn.Module):
    """Blocks from BeginBlock and from ``with Block``; a Python branch on a shape (fx fails)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = poptorch.BeginBlock(nn.Linear(4, 8), "A", ipu_id=0)
        self.b = poptorch.BeginBlock(nn.Linear(8, 8), "B", ipu_id=1)
        self.c = nn.Linear(8, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        h = self.a(x)
        if h.shape[-1] == 8:  # a decision on a shape: torch.fx cannot take it
            h = torch.relu(h)
        with torch.no_grad():
            shift = h.mean() * 0.5
        h = self.b(h) - shift
        with poptorch.Block("C", ipu_id=2):
            out = self.c(h)
            loss = self.loss(out, y)
        return out, loss


class ValueBranch(nn.Module):
    """A Python branch on a tensor's value: no capture can follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = poptorch.BeginBlock(nn.Linear(4, 4), "A", ipu_id=0)
        self.b = poptorch.BeginBlock(nn.Linear(4, 3), "B", ipu_id=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:  # VALUE-BRANCH
            h = h * 2
        return self.b(h)


def _inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 4), torch.randint(0, 3, (n,))


def _strategy(name: str):
    if name == "pipelined":
        return poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu)
    return poptorch.ShardedExecution()


def test_fx_traces_what_it_can_and_export_takes_the_rest() -> None:
    plain = capture_model(nn.Linear(2, 2), (torch.ones(1, 2),), {})
    assert plain.capture == "torch.fx"
    trace = capture_model(ShapeBranch(), _inputs(2), {})
    assert trace.capture == "torch.export"
    assert [(e.block_id, e.ipu_id) for e in trace.entries] == [("A", 0), ("B", 1), ("C", 2)]
    assert trace.input_names == ("x", "y")


def test_block_membership_survives_export() -> None:
    trace = capture_model(ShapeBranch(), _inputs(2), {}, method="export")
    blocks = {}
    for node in trace.graph.nodes:
        if node.op == "call_function":
            entry = node.meta["block_entry"]
            blocks.setdefault(trace.entries[entry].block_id, []).append(str(node.target))
    assert [t for t in blocks["A"] if "linear" in t] == ["aten.linear.default"]
    assert blocks["B"][:2] == ["aten.linear.default", "aten.sub.Tensor"]  # BeginBlock's hook
    assert blocks["C"] == ["aten.linear.default", "aten.cross_entropy_loss.default"]  # with Block
    no_grad = [n for n in trace.graph.nodes if n.meta.get("grad_enabled") is False]
    assert [str(n.target) for n in no_grad] == ["aten.mean.default", "aten.mul.Tensor"]
    losses = [n for n in trace.graph.nodes if n.meta.get("loss")]
    assert [str(n.target) for n in losses] == ["aten.cross_entropy_loss.default"]


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_exported_model_trains_like_eager(strategy: str) -> None:
    model = ShapeBranch()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().autoRoundNumIPUs(True).setExecutionStrategy(_strategy(strategy))
    opts.Training.gradientAccumulation(6)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = _inputs(12)
    for _ in range(2):
        out, loss = training(x, y)
    program = training._executable.program.program
    assert program.meta["capture"] == "torch.export"
    assert [s.ipu for s in program.stages] == [0, 1, 2]
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        (outs,) = train_reference(reference, ref_opt, (x, y), 1, 6, 1)
    torch.testing.assert_close(out, torch.cat([o[0][0] for o in outs]))
    torch.testing.assert_close(loss, torch.stack([o[0][1] for o in outs]))
    training.copyWeightsToHost()
    for name, param in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), param, msg=name)
    training.destroy()


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_exported_model_infers_like_eager(strategy: str) -> None:
    model = ShapeBranch()
    opts = poptorch.Options().autoRoundNumIPUs(True).setExecutionStrategy(_strategy(strategy))
    opts.deviceIterations(4)
    inference = poptorch.inferenceModel(model, opts)
    x, y = _inputs(8)
    out, loss = inference(x, y)
    assert inference._executable.program.program.meta["capture"] == "torch.export"
    with torch.no_grad():
        ref = [model(x[i : i + 2], y[i : i + 2]) for i in range(0, 8, 2)]
    torch.testing.assert_close(out, torch.cat([r[0] for r in ref]))
    torch.testing.assert_close(loss, torch.stack([r[1] for r in ref]))
    inference.destroy()


def test_capture_method_option_picks_the_front_end(capsys: pytest.CaptureFixture[str]) -> None:
    opts = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    opts.Jit.captureMethod("export")
    model = nn.Sequential(nn.Linear(4, 4), poptorch.BeginBlock(nn.Linear(4, 4), ipu_id=1))
    inference = poptorch.inferenceModel(model, opts)
    x = torch.randn(2, 4)
    poptorch.setLogLevel("DEBUG")
    try:
        out = inference(x)
    finally:
        poptorch.setLogLevel("WARN")
    assert "captured Sequential.forward with torch.export (non-strict)" in capsys.readouterr().err
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    inference.destroy()


def test_unknown_capture_method_is_an_error() -> None:
    with pytest.raises(ValueError, match="Unknown capture method 'jit'"):
        poptorch.Options().Jit.captureMethod("jit")


def test_fx_only_falls_back_to_one_ipu_naming_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    opts = poptorch.Options()
    opts.Jit.captureMethod("fx")
    model = ShapeBranch()
    inference = poptorch.inferenceModel(model, opts)
    x, y = _inputs(2)
    out, _ = inference(x, y)
    err = capsys.readouterr().err
    assert "cannot trace ShapeBranch.forward symbolically" in err
    assert "if h.shape[-1] == 8:" in err
    assert type(inference._executable.program).__name__ == "EagerProgram"
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, y)[0])


def test_value_dependent_branch_falls_back_naming_the_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = ValueBranch()
    inference = poptorch.inferenceModel(model, poptorch.Options())
    x = torch.randn(2, 4)
    out = inference(x)
    err = capsys.readouterr().err
    assert "cannot capture ValueBranch.forward with torch.export" in err
    assert "if h.sum() > 0:  # VALUE-BRANCH" in err
    assert type(inference._executable.program).__name__ == "EagerProgram"
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
