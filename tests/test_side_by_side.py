"""Inference micro-batches side by side (``runtime/side_by_side.py``): which graphs may compute
them so, the trials that offer the mode, and the runtime's runs of it against eager."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn.functional as F
from test_cores import observe_calls
from test_runtime import CPU, WIDTH, Dense
from torch import fx, nn

from poptorch_sim.errors import Error
from poptorch_sim.profiling.trace import TraceRecorder
from poptorch_sim.program import StagedProgram, StageSpec
from poptorch_sim.runtime import PipelineRuntime, trials
from poptorch_sim.runtime.cores import MODES, TRIAL_RUNS, CoreShare
from poptorch_sim.runtime.side_by_side import independent_micro_batches

ONE_IPU = {0: 5.0}  # one IPU's compute seconds per run, as the trials see it


@fx.wrap
def user_function(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


class WithLayers(nn.Module):
    """Dropout and BatchNorm layers: stateless in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.drop, self.norm = nn.Dropout(0.5), nn.BatchNorm1d(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.drop(x))


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x.sum())
        return x


class WritesAView(Counter):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count[0] = x.sum()
        return x


def graph(fn: nn.Module | object) -> fx.GraphModule:
    module = fn if isinstance(fn, nn.Module) else _Wrap(fn)  # type: ignore[arg-type]
    return fx.symbolic_trace(module)


class _Wrap(nn.Module):
    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def test_graphs_of_pytorch_ops_and_eval_layers_may_run_side_by_side() -> None:
    assert independent_micro_batches([graph(Dense()), graph(WithLayers().eval())])
    no_draw = graph(lambda x: F.dropout(x, 0.5, training=False) + x.view(-1, WIDTH).sum())
    assert independent_micro_batches([no_draw])
    in_place_on_a_value = graph(lambda x: (x * 2.0).add_(1.0))  # not a parameter or buffer
    assert independent_micro_batches([in_place_on_a_value])


@pytest.mark.parametrize(
    "module",
    [
        lambda: graph(lambda x: x + torch.rand_like(x)),
        lambda: graph(lambda x: F.dropout(x, 0.5)),  # F.dropout trains by default
        lambda: graph(WithLayers().train()),  # draws, and updates running statistics
        lambda: graph(Counter()),
        lambda: graph(WritesAView()),
        lambda: graph(lambda x: user_function(x)),
        lambda: Dense(),  # not a graph: anything may happen inside
    ],
    ids=[
        "random",
        "dropout-training",
        "train-mode-layers",
        "buffer-add_",
        "buffer-view",
        "user",
        "module",
    ],
)
def test_graphs_that_draw_write_state_or_call_user_code_do_not(module) -> None:  # type: ignore[no-untyped-def]
    assert not independent_micro_batches([graph(Dense()), module()])


def program(ipus: tuple[int, ...] = (0, 1, 0), sharded: bool = False) -> StagedProgram:
    names = ["x", *(f"h{i}" for i in range(1, len(ipus))), "y"]
    stages = [
        StageSpec(i, ipu, graph(Dense()), (names[i],), (names[i + 1],))
        for i, ipu in enumerate(ipus)
    ]
    return StagedProgram(stages, ("x",), ("y",), sharded=sharded)


def eager(prog: StagedProgram, batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    outs = []
    with torch.no_grad():
        for values in batches:
            x = values["x"]
            for spec in prog.stages:
                (x,) = spec.module(x)
            outs.append(x)
    return outs


def test_the_trials_offer_the_mode_to_inference_graphs_only(two_threads: int) -> None:
    with PipelineRuntime(program(), training=False, devices=CPU) as rt:
        assert rt.cores.trials == MODES
    with PipelineRuntime(program(sharded=True), training=False, devices=CPU) as rt:
        assert rt.cores.trials == ("one thread", "side by side")
        assert rt.cores.mode() == "one thread"
    plain = program()
    plain.stages[1] = StageSpec(1, 1, Dense(), ("h1",), ("h2",))
    with PipelineRuntime(plain, training=False, devices=CPU) as rt:
        assert "side by side" not in rt.cores.trials
    trained = program()
    trained.loss_name = "y"
    with PipelineRuntime(trained, training=True, devices=CPU) as rt:
        assert "side by side" not in rt.cores.trials


@pytest.mark.parametrize("sharded", [False, True])
def test_micro_batches_side_by_side_give_eager_outputs_on_one_core_each(
    monkeypatch: pytest.MonkeyPatch, two_threads: int, sharded: bool
) -> None:
    """Micro-batch m runs every stage on copy m mod 2, one intra-op thread each; the trace
    names each stage's IPU, on a track per copy; close() joins every thread."""
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    baseline = threading.active_count()
    prog = program(sharded=sharded)
    seen: set[tuple[str, int]] = set()
    for spec in prog.stages:
        spec.module.register_forward_hook(
            lambda *_: seen.add((threading.current_thread().name, torch.get_num_threads()))
        )
    batches = [{"x": torch.randn(4, WIDTH)} for _ in range(5)]
    want = eager(prog, batches)
    seen.clear()
    trace = TraceRecorder()
    with PipelineRuntime(prog, training=False, devices=CPU, trace=trace) as rt:
        monkeypatch.setattr(rt.cores, "mode", lambda: "side by side")
        monkeypatch.setattr(rt.cores, "probe", lambda count: None)
        got = rt.run(batches)
        again = rt.run(batches)
        assert torch.get_num_threads() == two_threads
    assert threading.active_count() == baseline
    for outputs in (got, again):
        torch.testing.assert_close([o["y"] for o in outputs], want)
    assert seen == {(f"poptorch_sim IPU 0, 1 side {copy}", 1) for copy in (0, 1)}
    forwards = {(e.ipu, e.stage, e.mb, e.track) for e in trace.events if e.category == "fwd"}
    ipus = (0, 1, 0)
    assert forwards == {
        (ipus[s], s, m, "side 1" if m % 2 else "") for s in range(3) for m in range(5)
    }


def test_a_failure_in_a_thread_of_several_ipus_returns_at_once_and_leaves_it_usable(
    monkeypatch: pytest.MonkeyPatch, two_threads: int
) -> None:
    """The failed stage is on IPU 1, the thread reporting it is not IPU 1's own: the caller
    stops the run without waiting for it, and the next run computes."""
    prog = program()
    batches = [{"x": torch.randn(4, WIDTH)} for _ in range(4)]
    bad = [dict(b) for b in batches]
    bad[3] = {"x": torch.randn(4, WIDTH + 1)}
    for mode in ("one thread", "side by side"):
        with PipelineRuntime(prog, training=False, devices=CPU) as rt:
            monkeypatch.setattr(rt.cores, "mode", lambda mode=mode: mode)
            monkeypatch.setattr(rt.cores, "probe", lambda count: None)
            start = time.monotonic()
            with pytest.raises(
                Error, match=r"stage 0 \(IPU 0\) failed in forward of micro-batch 3"
            ):
                rt.run(bad)
            assert time.monotonic() - start < 10.0
            torch.testing.assert_close([o["y"] for o in rt.run(batches)], eager(prog, batches))


def test_a_serial_programs_trials_compare_one_thread_with_side_by_side() -> None:
    """Whole calls on one thread, side by side timed on their first micro-batches."""
    share = CoreShare([0, 1], cores=2, serial=True, side_by_side=True)
    assert share.describe() == "one thread on 2 cores"  # nothing measured yet
    times = {"one thread": 0.30, "side by side": 0.20}
    seen = observe_calls(share, times, 1 + TRIAL_RUNS + 2, cost_s=ONE_IPU)
    assert seen == [
        ("one thread", None),
        *[("one thread", "side by side")] * TRIAL_RUNS,
        *[("side by side", None)] * 2,
    ]
    assert (
        share.describe() == "micro-batches side by side on 2 threads (one thread measured slower)"
    )
    assert share.cost == {}  # neither mode's thread is one IPU's
    kept = CoreShare([0, 1], cores=2, serial=True, side_by_side=True)
    observe_calls(kept, {"one thread": 0.20, "side by side": 0.30}, 1 + TRIAL_RUNS, cost_s=ONE_IPU)
    assert kept.describe() == "one thread on 2 cores (side by side measured slower)"


def test_side_by_side_must_beat_the_split_by_the_margin() -> None:
    share = CoreShare([0, 1], cores=2, one_thread=True, side_by_side=True)
    times = {"split": 0.30, "lent": 0.31, "one thread": 0.32, "side by side": 0.29}
    seen = observe_calls(share, times, 1 + 2 * TRIAL_RUNS, cost_s=ONE_IPU)
    assert {probe for _, probe in seen} == {None, "one thread", "side by side"}
    assert share.choice == "split"
    assert share.describe().endswith("lending, one thread and side by side measured slower)")
    faster = CoreShare([0, 1], cores=2, one_thread=True, side_by_side=True)
    observe_calls(
        faster, dict(times, **{"side by side": 0.28}), 1 + 2 * TRIAL_RUNS, cost_s=ONE_IPU
    )
    assert faster.choice == "side by side"


def test_a_trial_probing_side_by_side_infers_as_eager_does(
    monkeypatch: pytest.MonkeyPatch, two_threads: int
) -> None:
    """Calls whose first micro-batches ran side by side (or on one thread) and the rest
    pipelined give eager's outputs, each micro-batch's in its place."""
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    monkeypatch.setattr(trials, "RULED_OUT", float("inf"))  # every probe, whatever the times
    monkeypatch.setattr(trials, "UNDERUSED", 0.0)
    prog = program()
    ran = []
    with PipelineRuntime(prog, training=False, devices=CPU) as rt:
        for _ in range(1 + 2 * TRIAL_RUNS):
            batches = [{"x": torch.randn(4, WIDTH)} for _ in range(8)]
            probe = rt.cores.probe(len(batches))
            ran.append(probe.mode if probe is not None else None)
            got = rt.run(batches)
            torch.testing.assert_close([o["y"] for o in got], eager(prog, batches))
    assert ran == [None, *["one thread", "side by side"] * TRIAL_RUNS]
