"""Program outputs computed straight into the joined output ([Note: outputs computed in place]
in ``runtime/in_place.py``): the same values as eager, bit for bit; the caller's earlier
outputs never written; only host-only outputs of ATen operators with an ``out`` form."""

from __future__ import annotations

import pytest
import torch

import poptorch_sim as poptorch
import poptorch_sim.executor.outputs as outputs_module
from poptorch_sim.runtime.in_place import _out_form

WIDE = 4096  # 8 micro-batches x 64 rows x 4096 float32: the 8 MiB from which joins reuse memory


class Head(torch.nn.Module):
    """A small body on IPU 0 and a wide head on IPU 1, as a language model's LM head."""

    def __init__(self, hidden: bool = False) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, WIDE)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        with poptorch.Block("body", ipu_id=0):
            h = torch.relu(self.a(x))
        with poptorch.Block("head", ipu_id=1):
            logits = self.b(h)
        return (logits, h) if self.hidden else logits


def _inference(
    model: torch.nn.Module, sharded: bool = False, capture: str = "export"
) -> poptorch.PoplarExecutor:
    opts = poptorch.Options().deviceIterations(8)
    strategy = poptorch.ShardedExecution() if sharded else poptorch.PipelinedExecution()
    opts.setExecutionStrategy(strategy)
    opts.Jit.captureMethod(capture)
    return poptorch.inferenceModel(model, opts)


@pytest.fixture
def filled(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each joined output was found computed in place."""
    seen: list[bool] = []
    check = outputs_module._filled

    def record(joined: torch.Tensor, parts: list[object]) -> bool:
        seen.append(check(joined, parts))
        return seen[-1]

    monkeypatch.setattr(outputs_module, "_filled", record)
    return seen


@pytest.mark.parametrize("capture", ["export", "fx"])
@pytest.mark.parametrize("sharded", [False, True], ids=["pipelined", "sharded"])
def test_outputs_computed_in_place_equal_eager(
    filled: list[bool], sharded: bool, capture: str
) -> None:
    torch.manual_seed(0)
    model = Head().eval()
    x = torch.randn(8 * 64, 64)
    with torch.no_grad():
        want = model(x)
    sim = _inference(model, sharded, capture)
    first = sim(x)  # no shapes known yet: joined after the run
    assert filled == []
    kept = first.clone()
    for _ in range(3):
        out = sim(x)
        assert torch.equal(out, want)
    assert filled == [True] * 3
    assert torch.equal(first, kept)  # held by the caller: never a destination
    executors = sim._executable.program.runtime.stage_executors()
    assert executors[0].in_place is None and executors[1].in_place is not None
    sim.destroy()


def test_an_output_that_feeds_another_stage_is_joined_after_the_run(filled: list[bool]) -> None:
    """``h`` goes to the host and to the head's stage: its node is left alone (its destination
    is not written), and the values are still eager's."""
    torch.manual_seed(0)
    model = Head(hidden=True).eval()
    x = torch.randn(8 * 64, 64)
    with torch.no_grad():
        want = model(x)
    sim = _inference(model)
    for _ in range(3):
        logits, hidden = sim(x)
        assert torch.equal(logits, want[0]) and torch.equal(hidden, want[1])
    assert filled == [True, True]  # the logits of calls 2 and 3; h is too small to reserve
    assert sim._executable.program.runtime.stage_executors()[0].in_place is None
    sim.destroy()


def test_training_graphs_are_not_rewritten() -> None:
    model = Head()
    opts = poptorch.Options().setExecutionStrategy(poptorch.PipelinedExecution())
    opts.Training.gradientAccumulation(3)
    opts.Jit.captureMethod("export")

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(x)
            with poptorch.Block("loss", ipu_id=1):
                loss = poptorch.identity_loss(out.square().mean(), reduction="none")
            return out, loss

    training = poptorch.trainingModel(Loss(), opts)
    training(torch.randn(3 * 4, 64))
    executors = training._executable.program.runtime.stage_executors()
    assert all(e.in_place is None for e in executors.values())
    training.destroy()


@pytest.mark.parametrize(
    "op, qualifies",
    [
        (torch.ops.aten.linear.default, True),
        (torch.ops.aten.cat.default, True),
        (torch.ops.aten.addmm.default, True),
        (torch.ops.aten.view.default, False),  # a view: no out form
        (torch.ops.aten.alias.default, False),
        (torch.ops.aten.max.dim, False),  # two results
        (torch.ops.aten.add_.Tensor, False),  # in place already
        (torch.nn.functional.linear, False),  # not an ATen overload
    ],
)
def test_only_aten_operators_with_the_same_out_form_qualify(op: object, qualifies: bool) -> None:
    assert _out_form(op) is qualifies
