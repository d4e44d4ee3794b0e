"""The executor's public read-outs (placement, stages, all-reduce, batch layout) and its shape."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import poptorch_sim as poptorch
from poptorch_sim.executor import allreduce_stats, batch_layout, placement, staged_parts

EXECUTOR = Path(__file__).resolve().parent.parent / "poptorch_sim" / "executor"


class Net(torch.nn.Module):
    def __init__(self, blocks: bool = False) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        if blocks:
            self.a = poptorch.BeginBlock(self.a, "B1", ipu_id=0)
            self.b = poptorch.BeginBlock(self.b, "B2", ipu_id=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.b(torch.relu(self.a(x)))
        return out, torch.nn.functional.mse_loss(out, y)


def _pipelined_options() -> poptorch.Options:
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    return opts


def test_placement_of_one_program_and_of_a_pipeline() -> None:
    x, y = torch.randn(4, 4), torch.randn(4, 2)
    single = poptorch.trainingModel(Net())
    single(x, y)
    assert placement(single) == poptorch.executor.Placement(staged=False, stage_ipus=(), cores="")
    pipelined = poptorch.trainingModel(Net(blocks=True), _pipelined_options())
    pipelined(x, y)
    placed = placement(pipelined)
    assert placed.staged and placed.stage_ipus == (0, 1)
    assert "IPU 0" in placed.cores and "IPU 1" in placed.cores
    assert placed.mode == "split"  # the trial's first run (or a fixed split: one core, pinned)
    single.destroy()
    pipelined.destroy()


def test_staged_parts_of_one_program_and_of_a_pipeline() -> None:
    x, y = torch.randn(4, 4), torch.randn(4, 2)
    single = poptorch.trainingModel(Net())
    single.compile(x, y)
    assert staged_parts(single) is None
    pipelined = poptorch.trainingModel(Net(blocks=True), _pipelined_options())
    pipelined.compile(x, y)
    parts = staged_parts(pipelined)
    assert parts is not None and [s.ipu for s in parts.stages] == [0, 1]
    assert sorted(parts.executors) == [0, 1] and parts.trainer is not None
    assert all(e.probe is None for e in parts.executors.values())
    single.destroy()
    pipelined.destroy()
    with pytest.raises(poptorch.Error, match="has not been compiled"):
        staged_parts(single)


def test_placement_needs_a_compiled_model() -> None:
    model = poptorch.inferenceModel(Net())
    with pytest.raises(poptorch.Error, match="has not been compiled"):
        placement(model)


class _Peer:
    """One more process whose gradients equal ours, with a reducer's counters."""

    world_size, bucket_bytes = 2, 1024

    def __init__(self) -> None:
        self.steps, self.seconds, self.bytes_per_step = 0, 0.0, 0

    def all_reduce(self, params: list[torch.nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        for g in grads:
            g.mul_(2)
        self.steps += 1
        self.seconds += 0.5
        self.bytes_per_step = sum(g.numel() * g.element_size() for g in grads)


def test_allreduce_stats_follow_the_reducer(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = torch.randn(4, 4), torch.randn(4, 2)
    alone = poptorch.trainingModel(Net())
    alone(x, y)
    assert allreduce_stats(alone) is None  # one process: nothing is all-reduced
    alone.destroy()
    peer = _Peer()
    monkeypatch.setattr("poptorch_sim.executor.training.reducer_for", lambda options: peer)
    training = poptorch.trainingModel(Net())
    training(x, y)
    training(x, y)
    stats = allreduce_stats(training)
    assert stats is not None
    assert (stats.world_size, stats.bucket_bytes, stats.steps, stats.seconds) == (2, 1024, 2, 1.0)
    assert stats.bytes_per_step == (4 * 4 + 4 + 4 * 2 + 2) * 4  # every fp32 gradient
    training.destroy()


@pytest.mark.parametrize(
    ("di", "ga", "replicas", "training", "micro_batches"),
    [(1, 1, 1, True, 1), (3, 2, 1, True, 6), (2, 4, 2, True, 16), (2, 4, 2, False, 4)],
    ids=["default", "di3-ga2", "di2-ga4-r2", "inference-ignores-ga"],
)
def test_batch_layout_counts_micro_batches(
    di: int, ga: int, replicas: int, training: bool, micro_batches: int
) -> None:
    opts = poptorch.Options().deviceIterations(di).replicationFactor(replicas)
    opts.Training.gradientAccumulation(ga)
    layout = batch_layout(opts, training)
    assert layout.micro_batches == micro_batches
    assert (layout.device_iterations, layout.replicas) == (di, replicas)
    assert layout.gradient_accumulation == (ga if training else 1)


def _imports(path: Path) -> set[str]:
    modules = {p.stem for p in EXECUTOR.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            found.update(n for n in names if n in modules)
    return found


def test_executor_modules_import_without_cycles() -> None:
    graph = {p.stem: _imports(p) for p in EXECUTOR.glob("*.py")}
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                raise AssertionError(f"import cycle: {' -> '.join([*path, dep])}")
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
