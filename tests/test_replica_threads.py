"""Replicas of a single-IPU model on threads of their own (``executor/replica_threads.py``): the
same outputs, gradients and weights as the one-thread loop, to the bit at equal intra-op thread
counts; the one-thread loop wherever threads could change the result; failures named."""

from __future__ import annotations

import copy
import gc
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.executor.eager import EagerProgram


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every replica computes on one intra-op thread, on its thread or the caller's."""
    monkeypatch.setenv("POPTORCH_SIM_THREADS_PER_IPU", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


THREADS_SEEN: set[str] = set()  # not on the module: each replica thread runs a copy of it


class Recording(nn.Module):
    """An MLP with its loss, recording the thread each forward runs on."""

    def __init__(self, norm: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.norm = nn.BatchNorm1d(16) if norm else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        THREADS_SEEN.add(threading.current_thread().name)
        out = self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))
        return out, nn.functional.cross_entropy(out, y)


def _train(
    model: Recording, threads: bool, monkeypatch: pytest.MonkeyPatch, **options: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor], set[str]]:
    """Two calls of DI 2, GA 3, R 2 (or ``options``); returns the outputs, state and threads."""
    THREADS_SEEN.clear()
    if not threads:
        monkeypatch.setattr(EagerProgram, "use_replica_threads", lambda self, r: False)
    opts = poptorch.Options().deviceIterations(options.get("di", 2))
    opts.replicationFactor(options.get("replicas", 2))
    opts.Training.gradientAccumulation(options.get("ga", 3))
    opts.outputMode(poptorch.OutputMode.All)
    if options.get("own_buffers"):
        opts.broadcastBuffers(False)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    torch.manual_seed(1)
    n = 4 * options.get("di", 2) * options.get("ga", 3) * options.get("replicas", 2)
    x, y = torch.randn(n, 6), torch.randint(0, 3, (n,))
    outs = [training(x, y)[0] for _ in range(2)]
    program = training._executable.program
    used = program.replica_threads is not None
    training.destroy()
    monkeypatch.undo()
    assert used == threads
    return torch.cat(outs), copy.deepcopy(model.state_dict()), set(THREADS_SEEN)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_replica_threads_compute_what_the_one_thread_loop_computes(
    one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Recording()
    twin = copy.deepcopy(model)
    out, state, threads = _train(model, True, monkeypatch)
    ref_out, ref_state, ref_threads = _train(twin, False, monkeypatch)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    _same(state, ref_state)
    assert {"poptorch_sim replica 0", "poptorch_sim replica 1"} <= threads
    assert not any(name.startswith("poptorch_sim replica") for name in ref_threads)


def test_replica_threads_train_like_eager() -> None:
    model = Recording()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    out, _ = training(x, y)
    assert training._executable.program.replica_threads is not None
    training.destroy()
    outs = train_reference(
        reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, y), 1, 2, 2
    )
    torch.testing.assert_close(out, torch.cat([o[0] for a in outs[0] for o in a]))
    _same_close = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, _same_close[name], msg=name)


def test_per_replica_batch_norm_statistics_are_kept_on_threads(
    one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Recording(norm=True)
    twin = copy.deepcopy(model)
    out, state, _ = _train(model, True, monkeypatch, own_buffers=1)
    ref_out, ref_state, _ = _train(twin, False, monkeypatch, own_buffers=1)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    _same(state, ref_state)


@pytest.mark.parametrize(
    "model",
    [lambda: Recording(norm=True), lambda: Recording(dropout=0.5)],
    ids=["shared-buffers", "random-draws"],
)
def test_replicas_run_one_after_the_other_where_threads_would_interleave(
    model, monkeypatch: pytest.MonkeyPatch
) -> None:
    _out, _state, threads = _train(model(), False, monkeypatch)
    assert threads == {threading.current_thread().name}


class FailsOnReplica(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "poptorch_sim replica 1" and x.sum() > 1e6:
            raise ValueError("bad value")
        return self.fc(x)


def test_a_failing_replica_is_named_and_the_model_runs_again() -> None:
    opts = poptorch.Options().replicationFactor(2).deviceIterations(2)
    inference = poptorch.inferenceModel(FailsOnReplica(), opts)
    good = torch.ones(8, 2)
    inference(good)
    assert inference._executable.program.replica_threads is not None
    bad = good.clone()
    bad[6:] = 1e7  # device iteration 1, replica 1
    with pytest.raises(poptorch.Error, match="replica 1 failed on its micro-batch 0") as info:
        inference(bad)
    assert isinstance(info.value.__cause__, ValueError)
    torch.testing.assert_close(inference(good), FailsOnReplica.forward(inference.model, good))
    threads = inference._executable.program.replica_threads._threads
    inference.destroy()
    assert not any(t.is_alive() for t in threads)


def test_a_replicated_model_dropped_without_destroy_stops_its_threads() -> None:
    opts = poptorch.Options().replicationFactor(2)
    inference = poptorch.inferenceModel(nn.Linear(2, 2), opts)
    inference(torch.ones(4, 2))
    threads = list(inference._executable.program.replica_threads._threads)
    assert all(t.is_alive() for t in threads)
    del inference
    gc.collect()
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in threads)


def test_a_call_returns_once_its_replicas_are_done_without_a_poll_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A replica thread that is slow to leave its job after handing over its last result (here
    # 0.2 s, as a thread the OS parks would be): the caller waits until the thread marks the
    # job done, not for a next result of a job that has none left, which would last a whole
    # poll interval (here made 30 s) per call.
    from poptorch_sim.executor import replica_threads

    monkeypatch.setattr(replica_threads, "POLL_S", 30.0)
    hand_over = replica_threads._Replica._put

    def slow_to_leave(self: replica_threads._Replica, item: object, job: object) -> bool:
        handed = hand_over(self, item, job)
        time.sleep(0.2)
        return handed

    monkeypatch.setattr(replica_threads._Replica, "_put", slow_to_leave)
    opts = poptorch.Options().replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    model = Recording()
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    training(x, y)
    assert training._executable.program.replica_threads is not None
    start = time.monotonic()
    for _ in range(3):
        training(x, y)
    assert time.monotonic() - start < 10.0
    training.destroy()


class _Trainer:
    scale = 0.5


class DropsItsTrainerWhenCopied(nn.Module):
    """As a Lightning module: ``__getstate__`` (so ``copy.deepcopy``) leaves its trainer out,
    and ``forward`` reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self._trainer: _Trainer | None = _Trainer()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_trainer"] = None
        return state

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._trainer is None:
            raise RuntimeError("the module has no trainer")
        out = self.fc(x) * self._trainer.scale
        return out, nn.functional.cross_entropy(out, y)


def test_replicas_see_the_attributes_of_the_model_and_train_like_eager() -> None:
    model = DropsItsTrainerWhenCopied()
    reference = DropsItsTrainerWhenCopied()
    reference.load_state_dict(model.state_dict())
    opts = poptorch.Options().replicationFactor(2).deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    x, y = torch.randn(24, 6), torch.randint(0, 3, (24,))
    out, _ = training(x, y)
    threads = training._executable.program.replica_threads
    assert threads is not None
    assert all(m._trainer is model._trainer for m in threads.modules)
    training.destroy()
    outs = train_reference(
        reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, y), 2, 2, 2
    )
    torch.testing.assert_close(out, torch.cat([o[0] for d in outs for a in d for o in a]))
    expected = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, expected[name], msg=name)
