"""Pipeline schedules as data: per-IPU action lists, their clock grid and their validator.

Glossary (the one vocabulary of the project; other modules cite it):

=========================  ==========================================================================
micro-batch (``mb``)       the rows one stage processes in one step: the host batch divided by
                           ``deviceIterations * gradientAccumulation * replicas``. Micro-batches
                           are numbered ``0 .. M-1`` within one run; ``M`` is their count.
block                      a user annotation (``poptorch.Block``, ``BeginBlock``) naming a region of
                           the model; the compiler maps each block to a stage.
stage                      a contiguous piece of the model, run as one unit (``StageSpec``); stages
                           are numbered ``0 .. N-1`` in forward order. ``N`` is their count.
IPU                        a simulated device: one worker thread that owns the parameters of the
                           stages placed on it. An IPU may hold several stages (e.g. the head of a
                           model back on IPU 0).
replica                    a whole copy of the pipeline working on other micro-batches; gradients
                           are reduced across replicas (not the runtime's concern here).
device iteration           one optimizer step's worth of micro-batches (training) or one forward
                           of a micro-batch (inference); a run may cover several.
combined batch size        ``mb * deviceIterations * gradientAccumulation * replicas``: the rows of
                           one host batch.
fwd / bwd                  the forward and backward pass of one stage on one micro-batch
                           (actions ``F`` and ``B``).
=========================  ==========================================================================

A *schedule* is a pure function ``(num_stages, num_microbatches) -> Schedule``: for each IPU an
ordered list of :class:`Action` (``1F0`` = stage 1 forward of micro-batch 0). The executor only
interprets the lists; everything here is checked without threads.

Each compute action is wrapped by its transfers::

    RECV_F(s, m)  F(s, m)  SEND_F(s, m)      activations in from earlier stages / the host, out
    RECV_B(s, m)  B(s, m)  SEND_B(s, m)      gradients in from later stages, out to earlier ones
    STEP(s)                                  after the stage's last B (training only)

(stage 0 receives its gradients from nobody and the last stage sends none). A RECV blocks
until the matching SEND has happened; sends never block.

The pipeline clock (``format_grid``; rows = IPUs, columns = ticks, one compute action per IPU
per tick, transfers take no tick), 1F1B with 2 stages and 4 micro-batches::

    tick   0      1      2      3      4      5      6      7      8      9      10
    IPU 0  0F0    0F1    .      0B0    0F2    0B1    0F3    0B2    .      0B3    0STEP
    IPU 1  .      1F0    1B0    1F1    1B1    1F2    1B2    1F3    1B3    1STEP
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ..errors import Error
from .actions import Action, ActionKind
from .clock import Schedule, format_grid, simulate, validate

__all__ = [
    "ActionKind",
    "Action",
    "Schedule",
    "SCHEDULES",
    "fill_drain",
    "one_f_one_b",
    "forward_only",
    "sharded",
    "make_schedule",
    "simulate",
    "validate",
    "format_grid",
]


# -- per-stage orders ---------------------------------------------------------------------------

StageOrder = Callable[[int, int, int], list[Action]]


def _fill_drain_order(stage: int, n: int, m: int) -> list[Action]:
    """GPipe: every forward, then every backward."""
    fwd = [Action(stage, ActionKind.F, i) for i in range(m)]
    return fwd + [Action(stage, ActionKind.B, i) for i in range(m)]


def _one_f_one_b_order(stage: int, n: int, m: int, lookahead: int = 0) -> list[Action]:
    """PipeDream-flush: ``N - stage`` forwards to fill (``lookahead`` more on every stage but
    the last), then alternate B and F, then drain."""
    warmup = min(n - stage + (lookahead if stage < n - 1 else 0), m)
    order = [Action(stage, ActionKind.F, i) for i in range(warmup)]
    for i in range(m):
        order.append(Action(stage, ActionKind.B, i))
        if warmup + i < m:
            order.append(Action(stage, ActionKind.F, warmup + i))
    return order


def _forward_order(stage: int, n: int, m: int) -> list[Action]:
    return [Action(stage, ActionKind.F, i) for i in range(m)]


def _sharded_training_order(stage: int, n: int, m: int) -> list[Action]:
    """One micro-batch at a time: F then B of each micro-batch before the next one starts."""
    order: list[Action] = []
    for i in range(m):
        order += [Action(stage, ActionKind.F, i), Action(stage, ActionKind.B, i)]
    return order


# -- placement: per-stage orders -> per-IPU lists --------------------------------------------------


def _compute_deps(action: Action, n: int, serial: bool) -> list[Action]:
    """Compute actions of *other* stages that ``action`` waits for (own order aside)."""
    s, m = action.stage, action.mb
    if action.kind is ActionKind.F and m is not None:
        if s > 0:
            return [Action(s - 1, ActionKind.F, m)]
        if serial and m > 0:
            return [Action(n - 1, ActionKind.F, m - 1)]
    if action.kind is ActionKind.B and m is not None and s < n - 1:
        return [Action(s + 1, ActionKind.B, m)]
    return []


def _place(
    orders: list[list[Action]], stage_ipus: Sequence[int], serial: bool
) -> list[list[Action]]:
    """Merge per-stage compute orders into per-IPU orders by simulating the clock.

    Each tick every IPU runs the first ready head among its stages (a backward before a forward,
    then the earliest micro-batch), so an IPU holding several stages interleaves them as data
    arrives.
    """
    n = len(orders)
    heads = [0] * n
    done: set[Action] = set()
    per_ipu: list[list[Action]] = [[] for _ in range(max(stage_ipus) + 1)]
    while any(heads[s] < len(orders[s]) for s in range(n)):
        ticked: list[Action] = []
        for ipu, ipu_list in enumerate(per_ipu):
            ready = [
                orders[s][heads[s]]
                for s in range(n)
                if stage_ipus[s] == ipu
                and heads[s] < len(orders[s])
                and all(d in done for d in _compute_deps(orders[s][heads[s]], n, serial))
            ]
            if ready:
                pick = min(ready, key=lambda a: (a.kind is not ActionKind.B, a.mb or 0, -a.stage))
                heads[pick.stage] += 1
                ipu_list.append(pick)
                ticked.append(pick)
        if not ticked:
            raise Error(f"schedule placement made no progress (stage heads at {heads})")
        done.update(ticked)
    return per_ipu


def _with_transfers(compute: list[Action], n: int) -> tuple[Action, ...]:
    """Wrap each compute action with the sends and receives it needs."""
    out: list[Action] = []
    for a in compute:
        s, m = a.stage, a.mb
        if a.kind is ActionKind.F:
            out += [Action(s, ActionKind.RECV_F, m), a, Action(s, ActionKind.SEND_F, m)]
        elif a.kind is ActionKind.B:
            out += [Action(s, ActionKind.RECV_B, m)] if s < n - 1 else []
            out.append(a)
            out += [Action(s, ActionKind.SEND_B, m)] if s > 0 else []
        else:
            out.append(a)
    return tuple(out)


def _build(
    name: str,
    order: StageOrder,
    num_stages: int,
    num_microbatches: int,
    *,
    training: bool,
    stage_ipus: Sequence[int] | None,
    serial: bool = False,
) -> Schedule:
    if num_stages < 1 or num_microbatches < 1:
        raise Error(
            f"a schedule needs at least one stage and one micro-batch, got "
            f"num_stages={num_stages}, num_microbatches={num_microbatches}"
        )
    ipus = tuple(stage_ipus) if stage_ipus is not None else tuple(range(num_stages))
    if len(ipus) != num_stages or min(ipus) < 0:
        raise Error(
            f"stage_ipus must give a non-negative IPU per stage ({num_stages}), got {ipus}"
        )
    orders = [order(s, num_stages, num_microbatches) for s in range(num_stages)]
    if training:
        for s, stage_order in enumerate(orders):
            stage_order.append(Action(s, ActionKind.STEP))
    placed = _place(orders, ipus, serial)
    lists = tuple(_with_transfers(compute, num_stages) for compute in placed)
    schedule = Schedule(name, num_stages, num_microbatches, training, ipus, lists, serial)
    validate(schedule)
    return schedule


def fill_drain(
    num_stages: int, num_microbatches: int, *, stage_ipus: Sequence[int] | None = None
) -> Schedule:
    """GPipe's training schedule: fill the pipeline with all forwards, then drain the backwards.

    Args:
        num_stages: ``N``.
        num_microbatches: ``M``.
        stage_ipus: IPU of each stage (default: stage ``i`` on IPU ``i``).

    Returns:
        The validated schedule.

    >>> fill_drain(2, 2).ipu_actions[1]
    (1RECV_F0, 1F0, 1SEND_F0, 1RECV_F1, 1F1, 1SEND_F1, 1B0, 1SEND_B0, 1B1, 1SEND_B1, 1STEP)
    """
    return _build(
        "fill_drain",
        _fill_drain_order,
        num_stages,
        num_microbatches,
        training=True,
        stage_ipus=stage_ipus,
    )


def one_f_one_b(
    num_stages: int,
    num_microbatches: int,
    *,
    stage_ipus: Sequence[int] | None = None,
    lookahead: int = 0,
) -> Schedule:
    """1F1B training schedule: after filling, each stage alternates one backward, one forward.

    At most ``N - stage`` micro-batches are in flight on a stage, against ``M`` for fill-drain.
    See [Note: lookahead] for ``lookahead``.

    Args:
        num_stages: ``N``.
        num_microbatches: ``M``.
        stage_ipus: IPU of each stage (default: stage ``i`` on IPU ``i``).
        lookahead: forwards run ahead on every stage but the last (0: plain 1F1B).

    Returns:
        The validated schedule.

    >>> [a for a in one_f_one_b(2, 3).ipu_actions[1] if a.kind.value in "FB"]
    [1F0, 1B0, 1F1, 1B1, 1F2, 1B2]
    """
    if lookahead < 0:
        raise Error(f"lookahead must be at least 0, got {lookahead}")
    return _build(
        "1f1b",
        functools.partial(_one_f_one_b_order, lookahead=lookahead),
        num_stages,
        num_microbatches,
        training=True,
        stage_ipus=stage_ipus,
    )


def forward_only(
    num_stages: int, num_microbatches: int, *, stage_ipus: Sequence[int] | None = None
) -> Schedule:
    """Inference: every stage runs the forward of every micro-batch, pipelined.

    >>> forward_only(1, 2).ipu_actions[0]
    (0RECV_F0, 0F0, 0SEND_F0, 0RECV_F1, 0F1, 0SEND_F1)
    """
    return _build(
        "forward",
        _forward_order,
        num_stages,
        num_microbatches,
        training=False,
        stage_ipus=stage_ipus,
    )


def sharded(
    num_stages: int,
    num_microbatches: int,
    *,
    training: bool = True,
    stage_ipus: Sequence[int] | None = None,
) -> Schedule:
    """Sharded execution: one micro-batch at a time passes through the stages in order.

    Only one IPU is busy at any tick; the model is split for memory, not speed.

    >>> print(format_grid(sharded(2, 2, training=False)))
    tick   0    1    2    3
    IPU 0  0F0  .    0F1
    IPU 1  .    1F0  .    1F1
    """
    order = _sharded_training_order if training else _forward_order
    return _build(
        "sharded",
        order,
        num_stages,
        num_microbatches,
        training=training,
        stage_ipus=stage_ipus,
        serial=True,
    )


# [Note: lookahead]
# On worker threads a send wakes its receiver only if the receiver is already blocked waiting
# for it, and a wake-up is what costs: ``Queue.put`` -> ``Condition.notify`` held the sender's
# GIL for about a quarter of each worker's Python time in plain 1F1B (py-spy --gil, N=2, M=32),
# where every activation and gradient arrives just as its receiver starts to wait for it. One
# forward of look-ahead on every stage but the last gives those transfers a micro-batch of
# slack, so they mostly land while the receiver computes. It costs one more micro-batch of
# stored activations per stage and does not change the numbers (backward order stays 0..M-1).
# Measured on the quiet 2-core machine (benchmarks/pipeline.py's balanced stages, N=2,
# interleaved medians): 162/137 ms -> 144/129 ms at M=32 and 51 -> 43 ms at M=8; two
# forwards ahead were no better than one.
RUNTIME_LOOKAHEAD = 1

SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "fill_drain": fill_drain,
    "1f1b": functools.partial(one_f_one_b, lookahead=RUNTIME_LOOKAHEAD),
    "forward": forward_only,
    "sharded": sharded,
}


def make_schedule(
    name: str,
    num_stages: int,
    num_microbatches: int,
    *,
    training: bool,
    stage_ipus: Sequence[int] | None = None,
) -> Schedule:
    """Build a schedule by name; inference always uses ``forward`` unless ``name`` is sharded.

    Raises:
        Error: ``name`` is not one of ``SCHEDULES``.
    """
    if name not in SCHEDULES:
        raise Error(
            f"unknown pipeline schedule {name!r} (known schedules: {', '.join(SCHEDULES)})"
        )
    if name == "sharded":
        return sharded(num_stages, num_microbatches, training=training, stage_ipus=stage_ipus)
    if not training:
        return forward_only(num_stages, num_microbatches, stage_ipus=stage_ipus)
    if name == "forward":
        raise Error("the 'forward' schedule has no backward pass; use '1f1b' or 'fill_drain'")
    return SCHEDULES[name](num_stages, num_microbatches, stage_ipus=stage_ipus)
