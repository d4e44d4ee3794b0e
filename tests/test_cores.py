"""How the IPU workers share the cores (``runtime/cores.py``): the core budget and the measured
work as pure logic, then the runtime lending cores (threads seen by the stages, the trace's
counter tracks, the process-wide default left as it was)."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable

import pytest
import torch
from test_runtime import RecordThreads, chain, eager, micro_batches, sgd

from poptorch_sim.profiling.trace import TraceRecorder
from poptorch_sim.program import StagedProgram, StageSpec
from poptorch_sim.runtime import PipelineRuntime, intra_op, trials
from poptorch_sim.runtime.cores import (
    TRIAL_EVERY,
    TRIAL_EVERY_MAX,
    TRIAL_RUNS,
    CoreBudget,
    CoreShare,
    apportion,
)

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


# -- CoreBudget: cores lent per compute action ---------------------------------------------------
def test_a_worker_computing_alone_takes_every_core() -> None:
    budget = CoreBudget(4)
    assert budget.take(2) == 4
    assert budget.held == {2: 4}
    budget.give(2)
    assert budget.held == {}


def test_a_worker_waits_for_a_core_and_takes_what_is_given_back() -> None:
    budget = CoreBudget(2, patience_s=30.0)
    assert budget.take(0) == 2
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(budget.take(1)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and got == []  # no core free: it waits, it does not oversubscribe
    budget.give(0)
    waiter.join(10.0)
    assert got == [2] and budget.held == {1: 2}


def _queue_waiters(budget: CoreBudget, ipus: tuple[int, ...]) -> list[threading.Thread]:
    """Start a ``take`` for each of ``ipus`` and return once all of them wait."""
    waiters = [threading.Thread(target=budget.take, args=(ipu,)) for ipu in ipus]
    for waiter in waiters:
        waiter.start()
    _until(lambda: len(budget._waiting) == len(ipus))
    return waiters


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10.0
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_heaviest_waiter_is_served_first() -> None:
    budget = CoreBudget(1, priority={0: 0.7, 1: 0.2, 2: 0.1}, patience_s=30.0)
    budget.take(2)
    waiters = _queue_waiters(budget, (1, 0))
    budget.give(2)
    _until(lambda: budget.held == {0: 1})  # IPU 0 did the most work: it goes first
    assert budget._waiting == {1}
    budget.give(0)
    _until(lambda: budget.held == {1: 1})
    for waiter in waiters:
        waiter.join(10.0)


def test_cores_given_back_are_shared_between_the_waiters() -> None:
    budget = CoreBudget(2, patience_s=30.0)
    budget.take(2)
    waiters = _queue_waiters(budget, (0, 1))
    budget.give(2)
    for waiter in waiters:
        waiter.join(10.0)
    assert budget.held == {0: 1, 1: 1}  # not both cores to the first one served


def test_a_wait_longer_than_the_patience_takes_one_core_anyway() -> None:
    budget = CoreBudget(1, patience_s=0.05)
    budget.take(0)
    start = time.monotonic()
    assert budget.take(1) == 1  # the holder may be blocked on this worker: do not stall
    assert time.monotonic() - start >= 0.05
    assert budget.held == {0: 1, 1: 1}


def test_taking_twice_without_giving_back_is_an_error() -> None:
    budget = CoreBudget(2)
    budget.take(0)
    with pytest.raises(RuntimeError, match="IPU 0 takes cores while it holds 2"):
        budget.take(0)


def test_concurrent_workers_never_compute_on_more_threads_than_cores() -> None:
    budget = CoreBudget(3, patience_s=30.0)
    peak: list[int] = []
    lock = threading.Lock()

    def work(ipu: int) -> None:
        for _ in range(200):
            budget.take(ipu)
            with lock:
                peak.append(sum(budget.held.values()))
            budget.give(ipu)

    threads = [threading.Thread(target=work, args=(ipu,)) for ipu in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60.0)
    assert len(peak) == 1000 and max(peak) <= 3


# -- CoreShare ------------------------------------------------------------------------------------
HEAVY_FIRST = {0: 0.85, 1: 0.05, 2: 0.05, 3: 0.05}  # thread-seconds of one run per IPU


def test_pipelines_lend_cores_and_start_from_the_equal_split() -> None:
    share = CoreShare([0, 1, 2, 3], cores=2)
    assert (share.policy, share.threads) == ("lent", {0: 1, 1: 1, 2: 1, 3: 1})
    assert share.budget is not None and share.budget.cores == 2


def test_measured_work_is_smoothed_and_orders_the_waiters() -> None:
    share = CoreShare([0, 1, 2, 3], cores=2)
    share.observe(HEAVY_FIRST, {})  # warm-up run: not measured
    assert share.cost == {}
    share.observe(HEAVY_FIRST, {})
    share.observe({0: 0.45, 1: 0.05, 2: 0.05, 3: 0.05}, {})  # each run counts half
    assert share.cost[0] == pytest.approx(0.65)
    assert share.budget is not None and share.budget.priority is share.cost


@pytest.mark.parametrize(
    "lend_s, lending",
    [(0.20, True), (0.24, False), (0.30, False)],
    ids=["lending-faster", "lending-faster-within-margin", "split-faster"],
)
def test_trials_of_lending_against_the_measured_split_decide_the_runs_after(
    lend_s: float, lending: bool
) -> None:
    share = CoreShare([0, 1], cores=2)
    seen = []
    trial = 1 + 2 * TRIAL_RUNS
    for run in range(TRIAL_EVERY + trial):
        mode = share.mode()
        seen.append(mode)
        slow = 1.0 if run == 4 else 0.0  # one slow lent run in the trial: the fastest counts
        share.observe({0: 0.1, 1: 0.1}, {}, lend_s + slow if mode == "lent" else 0.25)
    chosen = "lent" if lending else "split"
    alternate = ["split", "lent"] * TRIAL_RUNS
    assert seen[:trial] == ["lent", *alternate]  # warm-up, then the trial
    assert seen[trial:TRIAL_EVERY] == [chosen] * (TRIAL_EVERY - trial)
    assert seen[TRIAL_EVERY : TRIAL_EVERY + trial] == [chosen, *alternate]
    assert share.choice == chosen
    assert share.describe().startswith(
        "lent" if lending else "measured split of 2 cores (IPU 0: 1, IPU 1: 1; lending measured"
    )


def observe_calls(
    share: CoreShare,
    times: dict[str, float],
    calls: int,
    count: int = 10,
    cost_s: dict[int, float] | None = None,
) -> list[tuple[str, str | None]]:
    """Feed ``share`` ``calls`` runs of ``count`` micro-batches timed by mode (a probe's by its
    mode), each IPU's compute ``cost_s`` (default 0.1 s on IPUs 0 and 1) on one thread: what
    each ran, and its probe."""
    cost_s = cost_s if cost_s is not None else {0: 0.1, 1: 0.1}
    ran = []
    for _ in range(calls):
        mode, probe = share.mode(), share.probe(count)
        ran.append((mode, probe.mode if probe is not None else None))
        probe_s = times[probe.mode] if probe is not None else None
        share.observe(cost_s, dict.fromkeys(cost_s, 1.0), times[mode], probe_s)
    return ran


def test_trials_that_keep_the_choice_come_less_often_and_a_change_resets_the_gap() -> None:
    share = CoreShare([0, 1], cores=2, one_thread=True)
    fast_one_thread = {"split": 0.30, "lent": 0.25, "one thread": 0.20}
    fast_split = {"split": 0.20, "lent": 0.25, "one thread": 0.26}  # within DRIFT of 0.20
    seen, chosen = [], {}
    for run in range(3200):
        seen += observe_calls(share, fast_split if run >= 1000 else fast_one_thread, 1)
        chosen[run] = share.choice
    lent = [run for run, (mode, _) in enumerate(seen) if mode == "lent" and run > 0]
    starts = [run - 1 for run in lent[::2]]  # each trial lends twice: its 2nd and 4th runs
    trial = [("split", "one thread"), ("lent", "one thread"), ("split", None), ("lent", None)]
    assert all(seen[s : s + 2 * TRIAL_RUNS] == trial for s in starts)
    # the first trial decides, and each that keeps its choice doubles the gap to the next; the
    # first trial after run 1000 finds the split fastest, and the gap starts again from 40
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    doubling = [TRIAL_EVERY * 2**k for k in range(5)]
    assert doubling[-1] == TRIAL_EVERY_MAX
    assert gaps == doubling + doubling + [TRIAL_EVERY_MAX]
    changed = starts[5] + 2 * TRIAL_RUNS - 1
    assert chosen[changed - 1] == "one thread" and chosen[changed] == "split"
    assert share.choice == "split"


@pytest.mark.parametrize(
    "times, chosen",
    [
        ({"split": 0.30, "lent": 0.25, "one thread": 0.20}, "one thread"),
        ({"split": 0.30, "lent": 0.20, "one thread": 0.25}, "lent"),
        ({"split": 0.30, "lent": 0.31, "one thread": 0.29}, "split"),
    ],
    ids=["one-thread-fastest", "lending-fastest", "within-margin-of-the-split"],
)
def test_trials_try_one_thread_for_every_stage_where_the_runtime_can(
    times: dict[str, float], chosen: str
) -> None:
    """One thread is timed on each trial call's first micro-batch, never on a whole call."""
    share = CoreShare([0, 1], cores=2, one_thread=True)
    assert share.trials == ("split", "lent", "one thread")
    trial = 1 + 2 * TRIAL_RUNS
    seen = observe_calls(share, times, TRIAL_EVERY + 1)
    probes = ["one thread"] * TRIAL_RUNS + [None] * TRIAL_RUNS
    assert seen[:trial] == [("lent", None), *zip(["split", "lent"] * TRIAL_RUNS, probes)]
    assert seen[trial:] == [(chosen, None)] * (TRIAL_EVERY + 1 - trial)
    assert share.choice == chosen
    expected = {
        "one thread": "one thread on 2 cores (split and lending measured slower)",
        "lent": "lent 2 cores",
        "split": "measured split of 2 cores (IPU 0: 1, IPU 1: 1; lending and one thread measured",
    }[chosen]
    assert share.describe().startswith(expected)


def test_runs_on_one_thread_leave_the_measured_work_alone() -> None:
    """One thread's compute time is every IPU's at once: it says nothing of each IPU's share."""
    share = CoreShare([0, 1], cores=2, one_thread=True)
    observe_calls(share, {"split": 0.3, "lent": 0.3, "one thread": 0.2}, 1 + 2 * TRIAL_RUNS)
    assert share.cost == {0: 0.1, 1: 0.1}
    assert share.mode() == "one thread"
    share.observe({0: 5.0}, {0: 2.0}, 0.2)
    assert share.cost == {0: 0.1, 1: 0.1} and share.mean_threads == {0: 1.0, 1: 1.0}


def test_runs_that_do_not_lend_use_the_split_by_measured_work() -> None:
    """A dominant stage gets the cores the others leave idle on the fixed split (GPT-2's LM
    head); before anything is measured the split is the equal one."""
    share = CoreShare([0, 1, 2, 3], cores=2)
    assert share.threads == {0: 1, 1: 1, 2: 1, 3: 1}
    heavy = {0: 0.84, 1: 0.06, 2: 0.05, 3: 0.05}
    share.observe(heavy, {})  # warm-up run: not measured
    assert share.threads == {0: 1, 1: 1, 2: 1, 3: 1}
    share.observe(heavy, {})
    assert share.threads == {0: 2, 1: 1, 2: 1, 3: 1}
    for _ in range(4):  # the work moves: the split follows the smoothed cost
        share.observe({0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}, {})
    assert share.threads == {0: 1, 1: 1, 2: 1, 3: 1}


def test_describe_names_the_mean_threads_and_the_work() -> None:
    share = CoreShare([0, 1], cores=2)
    assert share.describe() == "lent 2 cores"
    share.observe({0: 0.3, 1: 0.1}, {0: 1.5, 1: 1.0})
    share.observe({0: 0.3, 1: 0.1}, {0: 1.5, 1: 1.0})
    assert share.describe() == (
        "lent 2 cores (mean threads IPU 0: 1.5, IPU 1: 1.0; work IPU 0: 75%, IPU 1: 25%)"
    )


def test_pinned_split_never_changes_and_lends_nothing() -> None:
    share = CoreShare([0, 1], cores=2, fixed=3)
    assert (share.policy, share.threads, share.budget) == ("fixed", {0: 3, 1: 3}, None)
    for _ in range(5):
        share.observe({0: 1.0, 1: 0.0}, {0: 3.0, 1: 3.0})
    assert share.threads == {0: 3, 1: 3}
    assert share.describe() == "fixed split of 2 cores (IPU 0: 3, IPU 1: 3)"


def test_one_core_has_nothing_to_lend() -> None:
    share = CoreShare([0, 1], cores=1)
    assert (share.policy, share.threads, share.budget, share.mode()) == (
        "fixed",
        {0: 1, 1: 1},
        None,
        "split",
    )


def test_sharded_workers_each_get_every_core() -> None:
    share = CoreShare([0, 1, 2, 3], cores=16, serial=True)
    assert (share.policy, share.threads, share.budget) == (
        "serial",
        dict.fromkeys(range(4), 16),
        None,
    )


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


def test_a_stage_computing_alone_borrows_every_core(
    monkeypatch: pytest.MonkeyPatch, two_threads: int
) -> None:
    """One micro-batch: stage 1 waits for stage 0, so each computes alone, on both cores (the
    second run is the trial on the equal split, the third lends again)."""
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    monkeypatch.setattr(trials, "UNDERUSED", 0.0)  # lend, however little the stages compute
    program, probes = _two_stages()
    trace = TraceRecorder()
    with PipelineRuntime(program, training=False, devices=CPU, trace=trace) as rt:
        assert rt.cores.policy == "lent" and rt.cores.threads == {0: 1, 1: 1}
        out = rt.run([{"x": torch.ones(2)}])
        assert _fresh_thread_count() == two_threads  # the default is restored
        rt.run([{"x": torch.ones(2)}])
        assert rt.cores.mean_threads == {0: 1.0, 1: 1.0}
        rt.run([{"x": torch.ones(2)}])
        assert rt.cores.mean_threads == {0: 2.0, 1: 2.0}
        assert _fresh_thread_count() == two_threads
    assert [p.seen for p in probes] == [[2, 1, 2], [2, 1, 2]]
    assert torch.get_num_threads() == two_threads
    torch.testing.assert_close(out[0]["y"], torch.full((2,), 3.0))
    counts = [(ipu, value) for _, ipu, name, value in trace.counters if name == "threads"]
    # start-up, the first loan, the trial's equal split, lent again
    assert sorted(counts) == sorted(
        [(0, 1), (0, 2), (0, 1), (0, 2), (1, 1), (1, 2), (1, 1), (1, 2)]
    )
    chrome = [e for e in trace.to_chrome()["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in chrome} == {"IPU 0 threads", "IPU 1 threads"}


def test_a_pinned_count_is_kept_by_every_action(
    monkeypatch: pytest.MonkeyPatch, two_threads: int
) -> None:
    monkeypatch.setenv("POPTORCH_SIM_THREADS_PER_IPU", "1")
    program, probes = _two_stages()
    with PipelineRuntime(program, training=False, devices=CPU) as rt:
        assert (rt.cores.policy, rt.cores.budget) == ("fixed", None)
        rt.run([{"x": torch.ones(2)}] * 3)
    assert [p.seen for p in probes] == [[1, 1, 1], [1, 1, 1]]


def test_sharded_stages_run_on_every_core(
    monkeypatch: pytest.MonkeyPatch, two_threads: int
) -> None:
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    main_threads = torch.get_num_threads()
    program, probes = _two_stages(sharded=True)
    with PipelineRuntime(program, training=False, devices=CPU) as rt:
        rt.run([{"x": torch.ones(2)}])
        assert rt.cores.policy == "serial"
        assert rt.cores.describe() == f"one thread on {main_threads} cores"
    assert [p.seen for p in probes] == [[main_threads], [main_threads]]


def test_pipelined_runs_report_each_workers_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measurement the policy reads: thread-seconds and mean threads per IPU, every run."""
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    program, _ = _two_stages()
    observed: list[tuple[dict[int, float], dict[int, float]]] = []
    with PipelineRuntime(program, training=False, devices=CPU) as rt:
        monkeypatch.setattr(
            rt.cores, "observe", lambda cost, used, *_: observed.append((dict(cost), dict(used)))
        )
        for _ in range(2):
            rt.run([{"x": torch.ones(2)}] * 3)
    assert [(sorted(cost), sorted(used)) for cost, used in observed] == [([0, 1], [0, 1])] * 2
    assert all(s >= 0 for cost, _ in observed for s in cost.values())
    assert all(1 <= n <= rt.cores.cores for _, used in observed for n in used.values())


# -- idle workers free their OpenMP teams ------------------------------------------------------
class _Parallel(torch.nn.Module):
    """Ops large enough to run as 2-thread parallel regions."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.relu(x @ x.T)[:, : x.shape[1]].contiguous(),)


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settled_os_threads() -> int:
    """The thread count once no thread has started or ended for 0.1 s (exiting threads of
    earlier work leave /proc a little after they are joined or released)."""
    seen, stable = _os_threads(), 0
    deadline = time.monotonic() + 5.0
    while stable < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
        now = _os_threads()
        seen, stable = now, stable + 1 if now == seen else 0
    return seen


needs_teams = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or intra_op._PAUSE is None,
    reason="needs /proc and an OpenMP runtime with omp_pause_resource_all",
)


@needs_teams
@pytest.mark.parametrize("sharded", [False, True], ids=["pipelined", "sharded"])
def test_workers_free_their_intra_op_teams_when_a_run_ends(sharded: bool) -> None:
    """See [Note: idle teams slow every team]: a run leaves no pooled OpenMP thread behind."""
    x = torch.randn(512, 1024)
    # the control: a thread computing on 2 threads keeps pooled threads until it frees its team
    computed, released, leave = threading.Event(), threading.Event(), threading.Event()

    def hold_a_team() -> None:
        intra_op.set_worker_threads(2)
        _Parallel()(x)
        computed.set()
        released.wait()
        intra_op.release_team()
        leave.wait()

    holder = threading.Thread(target=hold_a_team)
    holder.start()
    computed.wait()
    with_team = settled_os_threads()
    released.set()
    _until(lambda: _os_threads() < with_team)  # the holder is still there: its team has gone
    leave.set()
    holder.join()

    stages = [
        StageSpec(0, 0, _Parallel(), ("x",), ("h",)),
        StageSpec(1, 1, _Parallel(), ("h",), ("y",)),
    ]
    program = StagedProgram(stages, ("x",), ("y",), sharded=sharded)
    with PipelineRuntime(program, training=False, devices=CPU, threads_per_ipu=2) as rt:
        idle = settled_os_threads()
        out = rt.run([{"x": x}] * 2)
        _until(lambda: _os_threads() <= idle)
    h = _Parallel()(x)[0]
    torch.testing.assert_close(out[1]["y"], _Parallel()(h)[0])


@needs_teams
def test_replica_threads_free_their_intra_op_teams_after_a_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas on 2 intra-op threads each leave as many threads behind as on 1 each."""
    import poptorch_sim as poptorch

    x = torch.randn(2 * 512, 1024)
    counts, outs = [], []
    for threads in ("1", "2"):
        monkeypatch.setenv("POPTORCH_SIM_THREADS_PER_IPU", threads)
        replicated = poptorch.inferenceModel(_Parallel(), poptorch.Options().replicationFactor(2))
        outs.append(replicated(x)[0])  # compiles, starts a thread per replica and runs
        counts.append(settled_os_threads())
        replicated.destroy()
    assert counts[1] == counts[0]
    want = torch.cat([_Parallel()(half)[0] for half in x.split(512)])
    torch.testing.assert_close(outs[0], want)
    torch.testing.assert_close(outs[1], want)


def test_every_mode_of_the_trials_trains_as_eager_does(
    monkeypatch: pytest.MonkeyPatch, two_threads: int
) -> None:
    """Through a trial (split and lent, each call's first micro-batch probed on one thread for
    every stage) the outputs and the weights after each step are eager's; one thread computes
    with every core and the trace still names each stage's IPU; close() joins the threads of
    both worker sets."""
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    monkeypatch.setattr(trials, "RULED_OUT", float("inf"))  # every mode, whatever the times
    monkeypatch.setattr(trials, "UNDERUSED", 0.0)
    baseline = threading.active_count()
    program = chain(3, [0, 1, 2, 0])
    reference = copy.deepcopy(program)
    seen: list[set[tuple[str, int]]] = []
    for spec in program.stages:
        spec.module.register_forward_hook(
            lambda *_: seen[-1].add((threading.current_thread().name, torch.get_num_threads()))
        )

    def step(module: torch.nn.Module) -> None:
        sgd(module)
        module.zero_grad()

    trace = TraceRecorder()
    ran = []
    with PipelineRuntime(program, training=True, devices=CPU, trace=trace) as rt:
        for _ in range(1 + 2 * TRIAL_RUNS):
            batches = micro_batches(5)
            want = eager(reference, batches, loss_scale=0.2)
            for spec in reference.stages:
                step(spec.module)
            probe = rt.cores.probe(len(batches))
            ran.append((rt.cores.mode(), probe.mode if probe is not None else None))
            split = dict(rt.cores.threads)
            seen.append(set())
            got = rt.run(batches, loss_scale=0.2, step=lambda s: step(program.stages[s].module))
            counted = {ipu: value for _, ipu, name, value in trace.counters if name == "threads"}
            if ran[-1][0] == "split":  # the trace's counters show what the run used
                assert counted == split
            torch.testing.assert_close(got, want)
            for ours, theirs in zip(program.stages, reference.stages):
                torch.testing.assert_close(ours.module.state_dict(), theirs.module.state_dict())
        assert threading.active_count() == baseline + 4  # three IPU threads and the one
    probes = ["one thread"] * TRIAL_RUNS + [None] * TRIAL_RUNS
    assert ran == [("lent", None), *zip(["split", "lent"] * TRIAL_RUNS, probes)]
    assert [probe for _, probe in ran[2 + TRIAL_RUNS - 1 :]] == [None] * TRIAL_RUNS
    ipu_threads = {f"poptorch_sim IPU {i}" for i in range(3)}
    for (_, probe), threads in zip(ran, seen):
        one = {("poptorch_sim IPU 0, 1, 2", two_threads)} if probe else set()
        assert {t for t in threads if t[0] not in ipu_threads} == one
        assert {name for name, _ in threads} == ipu_threads | {name for name, _ in one}
    assert {(e.ipu, e.stage) for e in trace.events if e.category == "fwd"} == {
        (0, 0),
        (1, 1),
        (2, 2),
        (0, 3),
    }
    probed = [e.mb for e in trace.events if e.category == "fwd" and e.stage == 3]
    assert sorted(probed) == sorted([*range(5)] * len(ran))  # every micro-batch once a call
    assert threading.active_count() == baseline


def test_one_thread_computes_each_micro_batch_before_the_next(
    monkeypatch: pytest.MonkeyPatch, two_threads: int
) -> None:
    """A training run on one thread for every stage follows the sharded order (each
    micro-batch's forward through every stage, then its backward) and gives eager's outputs
    and weights: the pipelined order on one thread kept several micro-batches alive."""
    monkeypatch.delenv("POPTORCH_SIM_THREADS_PER_IPU", raising=False)
    program = chain(3, [0, 1, 2, 3])
    reference = copy.deepcopy(program)
    batches = micro_batches(5)
    want = eager(reference, batches, loss_scale=0.2)
    for spec in reference.stages:
        sgd(spec.module)
    trace = TraceRecorder()
    with PipelineRuntime(program, training=True, devices=CPU, trace=trace) as rt:
        monkeypatch.setattr(rt.cores, "mode", lambda: "one thread")
        got = rt.run(batches, loss_scale=0.2, step=lambda s: sgd(program.stages[s].module))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for ours, theirs in zip(program.stages, reference.stages):
        torch.testing.assert_close(
            ours.module.state_dict(), theirs.module.state_dict(), rtol=0, atol=0
        )
    computed = [
        (e.category, e.stage, e.mb)
        for e in sorted(trace.events, key=lambda e: e.start_us)
        if e.category in ("fwd", "bwd")
    ]
    per_mb = [*[("fwd", s) for s in range(4)], *[("bwd", s) for s in (3, 2, 1, 0)]]
    assert computed == [(kind, s, m) for m in range(5) for kind, s in per_mb]
