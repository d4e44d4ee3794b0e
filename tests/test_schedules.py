"""Pipeline schedules as data: generators, the clock grid and the validator (no threads)."""

from __future__ import annotations

import dataclasses

import pytest

from poptorch_sim.errors import Error
from poptorch_sim.runtime import (
    Action,
    ActionKind,
    fill_drain,
    format_grid,
    forward_only,
    make_schedule,
    one_f_one_b,
    schedules,
    sharded,
    simulate,
    validate,
)

F, B, STEP = ActionKind.F, ActionKind.B, ActionKind.STEP
RECV_F, SEND_F, RECV_B, SEND_B = (
    ActionKind.RECV_F,
    ActionKind.SEND_F,
    ActionKind.RECV_B,
    ActionKind.SEND_B,
)

GENERATORS = {
    "fill_drain": lambda n, m, ipus=None: fill_drain(n, m, stage_ipus=ipus),
    "1f1b": lambda n, m, ipus=None: one_f_one_b(n, m, stage_ipus=ipus),
    "forward": lambda n, m, ipus=None: forward_only(n, m, stage_ipus=ipus),
    "sharded_train": lambda n, m, ipus=None: sharded(n, m, training=True, stage_ipus=ipus),
    "sharded_infer": lambda n, m, ipus=None: sharded(n, m, training=False, stage_ipus=ipus),
}
TRAINING = {"fill_drain": True, "1f1b": True, "forward": False}
TRAINING |= {"sharded_train": True, "sharded_infer": False}

SHAPES = [(1, 1), (2, 1), (2, 4), (3, 2), (4, 4), (4, 7), (4, 16), (8, 3)]


def compute_ticks(grid: list[list[Action | None]]) -> int:
    """Ticks until the last forward/backward (optimizer steps excluded)."""
    last = 0
    for row in grid:
        for t, a in enumerate(row):
            if a is not None and a.kind is not STEP:
                last = max(last, t + 1)
    return last


def ideal_ticks(name: str, n: int, m: int) -> int:
    return {
        "fill_drain": 2 * (m + n - 1),
        "1f1b": 2 * (m + n - 1),
        "forward": m + n - 1,
        "sharded_train": 2 * n * m,
        "sharded_infer": n * m,
    }[name]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"N{n}-M{m}" for n, m in SHAPES])
@pytest.mark.parametrize("name", list(GENERATORS))
def test_each_stage_runs_each_microbatch_once(name: str, shape: tuple[int, int]) -> None:
    n, m = shape
    schedule = GENERATORS[name](n, m)
    actions = [a for ipu_list in schedule.ipu_actions for a in ipu_list]
    for kind in (F, RECV_F, SEND_F):
        assert sorted((a.stage, a.mb) for a in actions if a.kind is kind) == [
            (s, i) for s in range(n) for i in range(m)
        ]
    backwards = sorted((a.stage, a.mb) for a in actions if a.kind is B)
    want_b = [(s, i) for s in range(n) for i in range(m)] if TRAINING[name] else []
    assert backwards == want_b
    assert sorted(a.stage for a in actions if a.kind is STEP) == (
        list(range(n)) if TRAINING[name] else []
    )
    assert not [a for a in actions if a.kind is RECV_B and a.stage == n - 1]
    assert not [a for a in actions if a.kind is SEND_B and a.stage == 0]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"N{n}-M{m}" for n, m in SHAPES])
@pytest.mark.parametrize("name", list(GENERATORS))
def test_clock_length_matches_the_ideal(name: str, shape: tuple[int, int]) -> None:
    n, m = shape
    assert compute_ticks(simulate(GENERATORS[name](n, m))) == ideal_ticks(name, n, m)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"N{n}-M{m}" for n, m in SHAPES])
@pytest.mark.parametrize("name", ["fill_drain", "1f1b"])
def test_microbatches_in_flight(name: str, shape: tuple[int, int]) -> None:
    """1F1B keeps at most N - stage micro-batches alive on a stage; fill-drain keeps all M."""
    n, m = shape
    schedule = GENERATORS[name](n, m)
    for s in range(n):
        live, peak = 0, 0
        for a in schedule.ipu_actions[s]:
            live += {F: 1, B: -1}.get(a.kind, 0)
            peak = max(peak, live)
        assert peak == (min(n - s, m) if name == "1f1b" else m)


def test_one_f_one_b_grid() -> None:
    assert format_grid(one_f_one_b(2, 4)) == "\n".join(
        [
            "tick   0      1      2      3      4      5      6      7      8      9      10",
            "IPU 0  0F0    0F1    .      0B0    0F2    0B1    0F3    0B2    .      0B3    0STEP",
            "IPU 1  .      1F0    1B0    1F1    1B1    1F2    1B2    1F3    1B3    1STEP",
        ]
    )


def test_fill_drain_grid() -> None:
    assert str(fill_drain(2, 3)) == "\n".join(
        [
            "tick   0      1      2      3      4      5      6      7      8",
            "IPU 0  0F0    0F1    0F2    .      .      0B0    0B1    0B2    0STEP",
            "IPU 1  .      1F0    1F1    1F2    1B0    1B1    1B2    1STEP",
        ]
    )


def test_forward_grid_is_a_diagonal_wave() -> None:
    assert format_grid(forward_only(3, 3)) == "\n".join(
        [
            "tick   0    1    2    3    4",
            "IPU 0  0F0  0F1  0F2",
            "IPU 1  .    1F0  1F1  1F2",
            "IPU 2  .    .    2F0  2F1  2F2",
        ]
    )


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
def test_sharded_runs_one_stage_at_a_time(training: bool) -> None:
    grid = simulate(sharded(3, 4, training=training))
    for t in range(max(len(row) for row in grid)):
        busy = [a for row in grid if t < len(row) and (a := row[t]) and a.kind is not STEP]
        assert len(busy) <= 1, f"tick {t}: {busy}"


def test_action_repr_is_compact() -> None:
    assert [repr(a) for a in (Action(1, F, 0), Action(0, STEP), Action(2, RECV_B, 3))] == [
        "1F0",
        "0STEP",
        "2RECV_B3",
    ]


@pytest.mark.parametrize("name", list(GENERATORS))
def test_an_ipu_may_hold_several_stages(name: str) -> None:
    """The head back on IPU 0: stages 0 and 3 share a worker."""
    schedule = GENERATORS[name](4, 6, [0, 1, 2, 0])
    assert len(schedule.ipu_actions) == 3
    assert {a.stage for a in schedule.ipu_actions[0]} == {0, 3}
    validate(schedule)


def test_make_schedule_picks_by_name() -> None:
    assert make_schedule("1f1b", 2, 3, training=True).name == "1f1b"
    assert make_schedule("fill_drain", 2, 3, training=True).name == "fill_drain"
    assert make_schedule("1f1b", 2, 3, training=False).name == "forward"
    assert make_schedule("sharded", 2, 3, training=False).serial


def test_make_schedule_rejects_unknown_names() -> None:
    with pytest.raises(Error, match=r"unknown pipeline schedule 'gpipe' \(known schedules: "):
        make_schedule("gpipe", 2, 3, training=True)
    with pytest.raises(Error, match="'forward' schedule has no backward pass"):
        make_schedule("forward", 2, 3, training=True)


@pytest.mark.parametrize(
    "n, m, ipus",
    [(0, 3, None), (2, 0, None), (2, 2, [0])],
    ids=["no-stages", "no-microbatches", "ipus-too-short"],
)
def test_generators_reject_bad_sizes(n: int, m: int, ipus: list[int] | None) -> None:
    with pytest.raises(Error, match="schedule needs at least one stage|stage_ipus must give"):
        one_f_one_b(n, m, stage_ipus=ipus)


def _edit(schedule, ipu: int, actions: list[Action]):  # type: ignore[no-untyped-def]
    lists = list(schedule.ipu_actions)
    lists[ipu] = tuple(actions)
    return dataclasses.replace(schedule, ipu_actions=tuple(lists))


def _swap(actions: tuple[Action, ...], a: Action, b: Action) -> list[Action]:
    out = list(actions)
    i, j = out.index(a), out.index(b)
    out[i], out[j] = out[j], out[i]
    return out


def _broken_cases():  # type: ignore[no-untyped-def]
    base = one_f_one_b(2, 2)
    ipu0, ipu1 = base.ipu_actions
    yield (
        "backward-before-forward",
        _edit(base, 1, _swap(ipu1, Action(1, F, 0), Action(1, B, 0))),
        "must come before",
    )
    yield "duplicate", _edit(base, 0, [*ipu0, Action(0, F, 0)]), "scheduled twice"
    yield "missing", _edit(base, 0, [a for a in ipu0 if a != Action(0, B, 1)]), "missing \\[0B1\\]"
    yield (
        "wrong-ipu",
        _edit(base, 0, [*ipu0, Action(1, F, 5)]),
        "on IPU 0 but stage 1 is not placed there",
    )
    yield (
        "step-too-early",
        _edit(base, 0, _swap(ipu0, Action(0, B, 1), Action(0, STEP))),
        "must come after the stage's last backward",
    )
    deadlock = [Action(0, RECV_B, 0)] + [a for a in ipu0 if a != Action(0, RECV_B, 0)]
    yield "deadlock", _edit(base, 0, deadlock), "deadlocks: blocked IPUs wait at"


@pytest.mark.parametrize(
    "schedule, message", [c[1:] for c in _broken_cases()], ids=[c[0] for c in _broken_cases()]
)
def test_validator_rejects_broken_schedules(schedule, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Error, match=message):
        validate(schedule)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"N{n}-M{m}" for n, m in SHAPES])
def test_lookahead_runs_forwards_ahead_on_all_but_the_last_stage(shape: tuple[int, int]) -> None:
    n, m = shape
    schedule = one_f_one_b(n, m, lookahead=1)
    validate(schedule)
    for s in range(n):
        live, peak = 0, 0
        for a in schedule.ipu_actions[s]:
            live += {F: 1, B: -1}.get(a.kind, 0)
            peak = max(peak, live)
        assert peak == min(n - s + (1 if s < n - 1 else 0), m)
    backward = [a.mb for a in schedule.ipu_actions[0] if a.kind is B]
    assert backward == list(range(m))  # gradients accumulate in the same order as without it


def test_runtime_1f1b_uses_the_lookahead_and_a_negative_one_is_an_error() -> None:
    assert make_schedule("1f1b", 3, 8, training=True) == one_f_one_b(
        3, 8, lookahead=schedules.RUNTIME_LOOKAHEAD
    )
    with pytest.raises(Error, match="lookahead must be at least 0, got -1"):
        one_f_one_b(2, 4, lookahead=-1)
