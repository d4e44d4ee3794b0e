"""A schedule (``Schedule``: per-IPU action lists) and its clock: simulate it tick by tick,
validate it, print it as a grid."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Error
from .actions import COMPUTE, Action, ActionKind

__all__ = ["Schedule", "simulate", "validate", "format_grid"]


@dataclass(frozen=True)
class Schedule:
    """Per-IPU action lists for ``num_stages`` stages and ``num_microbatches`` micro-batches.

    Attributes:
        name: the generator's name (a key of ``SCHEDULES``).
        num_stages: ``N``.
        num_microbatches: ``M``.
        training: whether backward passes and optimizer steps are scheduled.
        stage_ipus: the IPU of each stage.
        ipu_actions: for each IPU, its actions in execution order.
        serial: micro-batch ``m`` enters stage 0 only after the last stage has finished the
            forward of micro-batch ``m-1`` (sharded execution: one micro-batch in flight).
    """

    name: str
    num_stages: int
    num_microbatches: int
    training: bool
    stage_ipus: tuple[int, ...]
    ipu_actions: tuple[tuple[Action, ...], ...]
    serial: bool = False

    def __str__(self) -> str:
        return format_grid(self)


def _expected(schedule: Schedule) -> set[Action]:
    n, m, training = schedule.num_stages, schedule.num_microbatches, schedule.training
    want: set[Action] = set()
    for s in range(n):
        for i in range(m):
            want |= {Action(s, k, i) for k in (ActionKind.RECV_F, ActionKind.F, ActionKind.SEND_F)}
            if training:
                want.add(Action(s, ActionKind.B, i))
                want |= {Action(s, ActionKind.RECV_B, i)} if s < n - 1 else set()
                want |= {Action(s, ActionKind.SEND_B, i)} if s > 0 else set()
        if training:
            want.add(Action(s, ActionKind.STEP))
    return want


def _check_membership(schedule: Schedule) -> None:
    """Each expected action exactly once, and on its stage's IPU."""
    seen: dict[Action, int] = {}
    for ipu, actions in enumerate(schedule.ipu_actions):
        for a in actions:
            if a in seen:
                raise Error(f"action {a!r} is scheduled twice (IPU {seen[a]} and IPU {ipu})")
            if not 0 <= a.stage < schedule.num_stages or schedule.stage_ipus[a.stage] != ipu:
                raise Error(
                    f"action {a!r} is on IPU {ipu} but stage {a.stage} is not placed there"
                )
            seen[a] = ipu
    want = _expected(schedule)
    missing, extra = sorted(want - seen.keys(), key=repr), sorted(seen.keys() - want, key=repr)
    if missing or extra:
        raise Error(
            f"schedule {schedule.name!r} is incomplete: missing {missing}, unexpected {extra}"
        )


_BEFORE = {  # (earlier kind, later kind) pairs that must keep this order within a stage
    (ActionKind.RECV_F, ActionKind.F),
    (ActionKind.F, ActionKind.SEND_F),
    (ActionKind.F, ActionKind.B),
    (ActionKind.RECV_B, ActionKind.B),
    (ActionKind.B, ActionKind.SEND_B),
}


def _check_order(schedule: Schedule) -> None:
    """Within one IPU list: transfers around their compute, F before B, STEP after the last B."""
    for actions in schedule.ipu_actions:
        where = {a: i for i, a in enumerate(actions)}
        for a, i in where.items():
            for first, then in _BEFORE:
                if a.kind is then and where.get(Action(a.stage, first, a.mb), -1) > i:
                    raise Error(f"{Action(a.stage, first, a.mb)!r} must come before {a!r}")
            if a.kind is ActionKind.STEP:
                late = [b for b in actions[i:] if b.stage == a.stage and b.kind is ActionKind.B]
                if late:
                    raise Error(f"{a!r} must come after the stage's last backward, found {late}")


def _recv_ready(a: Action, schedule: Schedule, done: set[Action]) -> bool:
    n, s, m = schedule.num_stages, a.stage, a.mb
    if m is None:
        return True
    if a.kind is ActionKind.RECV_F:
        if s > 0:
            return Action(s - 1, ActionKind.SEND_F, m) in done
        return not schedule.serial or m == 0 or Action(n - 1, ActionKind.SEND_F, m - 1) in done
    return Action(s + 1, ActionKind.SEND_B, m) in done


def simulate(schedule: Schedule) -> list[list[Action | None]]:
    """Run the lists on an ideal clock: each tick, each IPU runs at most one compute action.

    A RECV waits until its SEND happened on an earlier tick; transfers take no tick.

    Returns:
        For each IPU, the compute action of each tick (``None`` = idle).

    Raises:
        Error: the lists deadlock (every unfinished IPU waits on a RECV that never comes).
    """
    lists = schedule.ipu_actions
    pos = [0] * len(lists)
    grid: list[list[Action | None]] = [[] for _ in lists]
    done: set[Action] = set()
    while any(p < len(actions) for p, actions in zip(pos, lists)):
        ticked: list[Action] = []
        for ipu, actions in enumerate(lists):
            computed, p = None, pos[ipu]
            while p < len(actions):
                a = actions[p]
                if a.kind in COMPUTE and computed is not None:
                    break
                if a.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                    if not _recv_ready(a, schedule, done):
                        break
                computed = a if a.kind in COMPUTE else computed
                ticked.append(a)
                p += 1
            pos[ipu] = p
            grid[ipu].append(computed)
        if not ticked:
            waiting = {ipu: lists[ipu][p] for ipu, p in enumerate(pos) if p < len(lists[ipu])}
            raise Error(f"schedule {schedule.name!r} deadlocks: blocked IPUs wait at {waiting}")
        done.update(ticked)
    return grid


def validate(schedule: Schedule) -> None:
    """Check a schedule: completeness, per-stage order, and that it runs without deadlock.

    Raises:
        Error: naming the first violated rule and the actions involved.
    """
    if len(schedule.ipu_actions) != max(schedule.stage_ipus) + 1:
        raise Error(
            f"schedule has {len(schedule.ipu_actions)} IPU lists for stage IPUs "
            f"{schedule.stage_ipus}"
        )
    _check_membership(schedule)
    _check_order(schedule)
    simulate(schedule)


def format_grid(schedule: Schedule) -> str:
    """The schedule's clock as text: one row per IPU, one column per tick, ``.`` when idle."""
    grid = simulate(schedule)
    for row in grid:
        while row and row[-1] is None:
            row.pop()
    ticks = max(len(row) for row in grid)
    cells = [[repr(a) if a is not None else "." for a in row] for row in grid]
    width = max([len(str(ticks - 1))] + [len(c) for row in cells for c in row])
    label = max(len(f"IPU {len(grid) - 1}"), len("tick"))
    lines = ["tick".ljust(label) + "  " + "  ".join(str(t).ljust(width) for t in range(ticks))]
    for ipu, row in enumerate(cells):
        lines.append(f"IPU {ipu}".ljust(label) + "  " + "  ".join(c.ljust(width) for c in row))
    return "\n".join(line.rstrip() for line in lines)
