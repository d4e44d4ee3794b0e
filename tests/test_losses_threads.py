"""Losses are recorded per thread: models compile, and replicas run their micro-batches, on
threads of their own, each with its own ``LossRecorder``."""

from __future__ import annotations

import threading

import torch

import poptorch_sim as poptorch
from poptorch_sim.executor.losses import LossRecorder, final_loss


def test_each_thread_records_its_own_identity_losses() -> None:
    # Thread A opens its recorder, thread B opens, uses and closes its own, then A computes its
    # loss: each must see exactly its own (a process-wide hook gave B both losses, or A none).
    opened, b_done = threading.Event(), threading.Event()
    seen: dict[str, list[torch.Tensor]] = {}

    def a() -> None:
        with LossRecorder() as recorder:
            opened.set()
            b_done.wait(timeout=60)
            loss = poptorch.identity_loss(torch.ones(3), "sum")
        seen["a"] = recorder.losses
        seen["a_loss"] = [loss]

    def b() -> None:
        opened.wait(timeout=60)
        with LossRecorder() as recorder:
            loss = poptorch.identity_loss(torch.full((2,), 2.0), "mean")
        seen["b"] = recorder.losses
        seen["b_loss"] = [loss]
        b_done.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [id(t) for t in seen["a"]] == [id(seen["a_loss"][0])]
    assert [id(t) for t in seen["b"]] == [id(seen["b_loss"][0])]
    assert final_loss(seen["a"]) == 0 and final_loss(seen["b"]) == 0


def test_a_recorder_inside_another_gives_the_outer_one_back() -> None:
    with LossRecorder() as outer:
        with LossRecorder() as inner:
            poptorch.identity_loss(torch.ones(2), "sum")
        poptorch.identity_loss(torch.ones(2), "mean")
    assert len(inner.losses) == 1 and len(outer.losses) == 1
