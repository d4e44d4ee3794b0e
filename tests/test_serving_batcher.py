"""The batching service under Runner and PackRunner: gathering, failure policies, close."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest

from poptorch_sim.serving.batcher import Batcher, Closed, fail_all, retry_alone

WAIT_S = 30.0


@dataclass
class Job:
    value: int
    size: int = 1
    future: Future[Any] = field(default_factory=Future)


class Bin:
    """Room for ``capacity`` units of size; starts each request when it is placed."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used = capacity, 0
        self.requests: list[Job] = []

    @property
    def full(self) -> bool:
        return self.used >= self.capacity

    def add(self, request: Job) -> bool:
        if request.size > self.capacity - self.used:
            return False
        if request.future.running() or request.future.set_running_or_notify_cancel():
            self.requests.append(request)
            self.used += request.size
        return True


class Doubler:
    """Doubles values; a negative value fails the whole call; a gate holds the first call."""

    def __init__(self, capacity: int, gated: bool = False) -> None:
        self.capacity = capacity
        self.calls: list[list[int]] = []
        self.entered, self.gate = threading.Event(), threading.Event()
        if not gated:
            self.gate.set()

    def open(self) -> Bin:
        return Bin(self.capacity)

    def call(self, batch: Bin) -> list[Any]:
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        values = [r.value for r in batch.requests]
        self.calls.append(values)
        if any(v < 0 for v in values):
            raise ValueError(f"negative value in {values}")
        return [2 * v for v in values]


def _batcher(policy: Doubler, **kwargs: Any) -> Batcher[Bin]:
    settings: dict[str, Any] = dict(
        max_queue=16, timeout_s=0.0, max_held=1, on_failure=fail_all, name="test", drain=True
    )
    settings.update(kwargs)
    return Batcher(policy, **settings)


def _submit_while_busy(batcher: Batcher[Bin], policy: Doubler, jobs: list[Job]) -> None:
    """Submit ``jobs[0]``, wait until its call is in the model, then queue the rest."""
    batcher.submit(jobs[0], None)
    assert policy.entered.wait(WAIT_S)
    for job in jobs[1:]:
        batcher.submit(job, None)
    policy.gate.set()


def test_batches_fill_in_arrival_order_and_a_misfit_opens_the_next() -> None:
    policy = Doubler(capacity=3, gated=True)
    batcher = _batcher(policy)
    jobs = [Job(1), Job(2), Job(3, size=2), Job(4), Job(5)]
    _submit_while_busy(batcher, policy, jobs)
    assert [j.future.result(WAIT_S) for j in jobs] == [2, 4, 6, 8, 10]
    batcher.close(RuntimeError)
    assert policy.calls == [[1], [2, 3], [4, 5]]  # 3 (size 2) fits after 2; 4 would not


def test_fail_all_fails_the_batch_and_the_service_goes_on() -> None:
    policy = Doubler(capacity=4, gated=True)
    batcher = _batcher(policy)
    jobs = [Job(0), Job(1), Job(-1), Job(2)]
    _submit_while_busy(batcher, policy, jobs)
    assert jobs[0].future.result(WAIT_S) == 0
    for job in jobs[1:]:
        with pytest.raises(ValueError, match="negative"):
            job.future.result(WAIT_S)
    later = Job(5)
    batcher.submit(later, None)
    assert later.future.result(WAIT_S) == 10
    batcher.close(RuntimeError)


def test_retry_alone_fails_only_the_failing_request() -> None:
    policy = Doubler(capacity=4, gated=True)
    batcher = _batcher(policy, on_failure=retry_alone)
    jobs = [Job(0), Job(1), Job(-1), Job(2)]
    _submit_while_busy(batcher, policy, jobs)
    assert [jobs[i].future.result(WAIT_S) for i in (0, 1, 3)] == [0, 2, 4]
    with pytest.raises(ValueError, match=r"negative value in \[-1\]"):
        jobs[2].future.result(WAIT_S)
    batcher.close(RuntimeError)
    assert policy.calls == [[0], [1, -1, 2], [1], [-1], [2]]


def test_close_drains_the_queue_when_asked_and_cuts_the_timeout_short() -> None:
    policy = Doubler(capacity=8)
    batcher = _batcher(policy, timeout_s=3600.0, max_held=8)
    jobs = [Job(i) for i in range(3)]
    for job in jobs:
        batcher.submit(job, None)
    batcher.close(RuntimeError)  # the hour-long gathering ends at once
    assert [j.future.result(0) for j in jobs] == [0, 2, 4]
    assert not batcher.threads[0].is_alive()
    with pytest.raises(Closed):
        batcher.submit(Job(9), None)


def test_close_without_draining_finishes_the_batch_in_hand_and_fails_the_waiting() -> None:
    policy = Doubler(capacity=1, gated=True)
    batcher = _batcher(policy, drain=False, feeders=2)
    first, second = Job(1), Job(2)
    batcher.submit(first, None)
    assert policy.entered.wait(WAIT_S)
    batcher.submit(second, None)  # the second feeder takes it into the (gated) model
    while batcher.queue.qsize():
        threading.Event().wait(0.01)
    waiting = [Job(3), Job(4)]
    for job in waiting:
        batcher.submit(job, None)
    closing = threading.Thread(target=batcher.close, args=(lambda: RuntimeError("closed"),))
    closing.start()
    assert batcher.stop.wait(WAIT_S)
    policy.gate.set()
    closing.join(WAIT_S)
    assert [first.future.result(0), second.future.result(0)] == [2, 4]
    for job in waiting:
        with pytest.raises(RuntimeError, match="closed"):
            job.future.result(0)
    assert [t.name for t in batcher.threads] == ["test 0", "test 1"]
    assert not any(t.is_alive() for t in batcher.threads)


def test_a_full_queue_refuses_after_the_timeout() -> None:
    policy = Doubler(capacity=1, gated=True)
    batcher = _batcher(policy, max_queue=1)
    batcher.submit(Job(1), None)
    assert policy.entered.wait(WAIT_S)
    batcher.submit(Job(2), None)
    with pytest.raises(queue.Full):
        batcher.submit(Job(3), 0.05)
    policy.gate.set()
    batcher.close(RuntimeError)
