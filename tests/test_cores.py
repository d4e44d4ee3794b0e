"""How the IPU workers share the cores (``runtime/cores.py``): the policy as pure logic with
injected timings, then the runtime applying a split (threads seen by the stages, the trace's
counter tracks, the process-wide default left as it was)."""

from __future__ import annotations

import threading

import pytest
import torch
from test_runtime import RecordThreads

from poptorch_sim.profiling.trace import TraceRecorder
from poptorch_sim.program import StagedProgram, StageSpec
from poptorch_sim.runtime import PipelineRuntime
from poptorch_sim.runtime.cores import CoreShare, apportion

CPU = {i: torch.device("cpu") for i in range(4)}


# -- apportion ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "costs, cores, want",
    [
        ({0: 85, 1: 5, 2: 5, 3: 5}, 2, {0: 2, 1: 1, 2: 1, 3: 1}),  # a dominant LM head
        ({0: 1, 1: 1, 2: 1, 3: 1}, 2, {0: 1, 1: 1, 2: 1, 3: 1}),  # balanced: the equal split
        ({0: 1, 1: 1, 2: 1, 3: 1}, 16, {0: 4, 1: 4, 2: 4, 3: 4}),
        ({0: 85, 1: 5, 2: 5, 3: 5}, 16, {0: 14, 1: 1, 2: 1, 3: 1}),
        ({0: 65, 1: 35}, 2, {0: 1, 1: 1}),  # 1.3 and 0.7 cores: both round to 1
        ({0: 80, 1: 20}, 2, {0: 2, 1: 1}),
        ({0: 1, 1: 0}, 4, {0: 4, 1: 1}),  # never below 1, never above the cores
        ({0: 0, 1: 0, 2: 0}, 8, {0: 2, 1: 2, 2: 2}),  # nothing measured: the equal split
        ({0: 0, 1: 0, 2: 0}, 2, {0: 1, 1: 1, 2: 1}),
    ],
    ids=[
        "gpt2-2-cores",
        "bert-2-cores",
        "bert-16-cores",
        "gpt2-16-cores",
        "near-balanced",
        "four-to-one",
        "idle-stage",
        "unmeasured-8",
        "unmeasured-2",
    ],
)
def test_apportion_gives_threads_by_share_of_cost(
    costs: dict[int, float], cores: int, want: dict[int, int]
) -> None:
    assert apportion(costs, cores) == want


# -- CoreShare ------------------------------------------------------------------------------------
HEAVY_FIRST = {0: 0.85, 1: 0.05, 2: 0.05, 3: 0.05}  # CPU seconds of one run per IPU


def test_measured_split_starts_equal_and_moves_after_two_agreeing_runs() -> None:
    share = CoreShare([0, 1, 2, 3], cores=2)
    assert (share.policy, share.threads) == ("measured", {0: 1, 1: 1, 2: 1, 3: 1})
    assert share.observe(HEAVY_FIRST) is False  # warm-up run: not measured
    assert share.cost == {}
    assert share.observe(HEAVY_FIRST) is False  # proposes {0: 2, ...}
    assert share.threads == {0: 1, 1: 1, 2: 1, 3: 1}
    assert share.observe(HEAVY_FIRST) is True  # confirmed
    assert share.threads == {0: 2, 1: 1, 2: 1, 3: 1}


def test_split_holds_when_the_heavy_stage_speeds_up_with_its_threads() -> None:
    """Costs are thread-seconds: with 2 threads IPU 0 takes half the CPU time of its thread."""
    share = CoreShare([0, 1, 2, 3], cores=2)
    for _ in range(3):
        share.observe(HEAVY_FIRST)
    faster = {0: 0.425, 1: 0.05, 2: 0.05, 3: 0.05}
    for _ in range(5):
        assert share.observe(faster) is False
    assert share.threads == {0: 2, 1: 1, 2: 1, 3: 1}
    assert share.cost[0] == pytest.approx(0.85)


def test_one_noisy_run_does_not_move_the_split() -> None:
    share = CoreShare([0, 1], cores=2)
    balanced, skewed = {0: 0.5, 1: 0.5}, {0: 0.95, 1: 0.05}
    share.observe(balanced)
    for runs in ([balanced, skewed, balanced, balanced], [skewed, balanced, skewed, balanced]):
        assert [share.observe(r) for r in runs] == [False] * 4
        assert share.threads == {0: 1, 1: 1}


def test_split_returns_to_equal_when_the_work_evens_out() -> None:
    share = CoreShare([0, 1], cores=2)
    changes = [share.observe({0: 0.9, 1: 0.1}) for _ in range(3)]
    assert changes == [False, False, True] and share.threads == {0: 2, 1: 1}
    even = {0: 0.25, 1: 0.5}  # IPU 0 ran on 2 threads: 0.5 thread-seconds, as IPU 1
    changes = [share.observe(even) for _ in range(6)]
    assert share.threads == {0: 1, 1: 1}
    assert changes.count(True) == 1


def test_pinned_split_never_changes() -> None:
    share = CoreShare([0, 1], cores=2, fixed=3)
    assert (share.policy, share.threads) == ("fixed", {0: 3, 1: 3})
    assert not any(share.observe({0: 1.0, 1: 0.0}) for _ in range(5))
    assert share.threads == {0: 3, 1: 3}


def test_sharded_workers_each_get_every_core() -> None:
    share = CoreShare([0, 1, 2, 3], cores=16, serial=True)
    assert (share.policy, share.threads) == ("serial", dict.fromkeys(range(4), 16))
    assert not any(share.observe(HEAVY_FIRST) for _ in range(5))


# -- the runtime applies the split ----------------------------------------------------------------
def _two_stages(sharded: bool = False) -> tuple[StagedProgram, list[RecordThreads]]:
    probes = [RecordThreads(), RecordThreads()]
    stages = [
        StageSpec(0, 0, probes[0], ("x",), ("h",)),
        StageSpec(1, 1, probes[1], ("h",), ("y",)),
    ]
    return StagedProgram(stages, ("x",), ("y",), sharded=sharded), probes


def _fresh_thread_count() -> int:
    seen: list[int] = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    t.start()
    t.join()
    return seen[0]


def test_workers_take_a_new_split_on_their_next_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    main_threads = torch.get_num_threads()
    program, probes = _two_stages()
    trace = TraceRecorder()
    with PipelineRuntime(program, training=False, devices=CPU, trace=trace) as rt:
        equal = dict(rt.cores.threads)
        rt.run([{"x": torch.ones(2)}])
        rt.cores.threads = {0: 3, 1: 1}  # as if measured; the policy is tested above
        out = rt.run([{"x": torch.ones(2)}] * 2)
        assert _fresh_thread_count() == main_threads  # the default is restored
    assert [p.seen for p in probes] == [[equal[0], 3, 3], [equal[1], 1, 1]]
    assert torch.get_num_threads() == main_threads
    torch.testing.assert_close(out[1]["y"], torch.full((2,), 3.0))
    counts = [(ipu, value) for _, ipu, name, value in trace.counters if name == "threads"]
    assert sorted(counts) == sorted([(0, equal[0]), (1, equal[1]), (0, 3), (1, 1)])
    chrome = [e for e in trace.to_chrome()["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in chrome} == {"IPU 0 threads", "IPU 1 threads"}


def test_sharded_stages_run_on_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    main_threads = torch.get_num_threads()
    program, probes = _two_stages(sharded=True)
    with PipelineRuntime(program, training=False, devices=CPU) as rt:
        rt.run([{"x": torch.ones(2)}])
        assert rt.cores.policy == "serial"
    assert [p.seen for p in probes] == [[main_threads], [main_threads]]


def test_pipelined_runs_report_each_workers_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measurement the policy reads: one CPU time per IPU after every run."""
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    program, _ = _two_stages()
    observed: list[dict[int, float]] = []
    with PipelineRuntime(program, training=False, devices=CPU) as rt:
        monkeypatch.setattr(rt.cores, "observe", lambda cpu: observed.append(dict(cpu)) or False)
        for _ in range(2):
            rt.run([{"x": torch.ones(2)}] * 3)
    assert [sorted(o) for o in observed] == [[0, 1], [0, 1]]
    assert all(seconds >= 0 for o in observed for seconds in o.values())
