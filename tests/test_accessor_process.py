"""The AsynchronousDataAccessor's worker process: a process of its own, a bounded shared ring,
clean failures when it dies, and no hang at exit (see data/worker_process.py)."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from loader_data import BreaksAtTwo, Pids

from poptorch_sim.data import AsynchronousDataAccessor
from poptorch_sim.data.sharing import WORKER_MODULE, preload_in_fork_server, references
from poptorch_sim.datasets import write_standin


def test_batches_are_loaded_in_another_process_and_match_eager() -> None:
    accessor = AsynchronousDataAccessor(Pids(), buffer_size=2)
    try:
        got = [batch.tolist() for batch in accessor]
        pid = accessor._worker._process.pid  # type: ignore[union-attr]
        assert [b[1] for b in got] == [b.tolist()[1] for b in Pids()]
        assert {b[0] for b in got} == {pid} and pid != os.getpid()
        assert int(accessor._worker._data_buffers.indices_mem.sum()) <= 2  # type: ignore[union-attr]
    finally:
        accessor.terminate()
    assert accessor._worker is None


def test_an_exception_that_cannot_be_pickled_arrives_as_runtime_error() -> None:
    accessor = AsynchronousDataAccessor(BreaksAtTwo())
    try:
        it = iter(accessor)
        assert [next(it).item(), next(it).item()] == [0, 1]
        with pytest.raises(RuntimeError, match="Unpicklable: the shard reader broke"):
            next(it)
    finally:
        accessor.terminate()


def test_a_killed_worker_is_reported_not_waited_for() -> None:
    accessor = AsynchronousDataAccessor(Pids(), buffer_size=1, load_indefinitely=False)
    try:
        it = iter(accessor)
        next(it)
        pid = accessor._worker._process.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
        accessor._worker._process.join(10)  # type: ignore[union-attr]
        with pytest.raises(RuntimeError, match="worker process has stopped .*SIGKILL"):
            for _ in range(5):
                next(it)
    finally:
        accessor.terminate()  # returns at once: the worker is gone


def test_exiting_with_a_live_accessor_neither_hangs_nor_prints() -> None:
    # SIGINT to the worker (Ctrl-C in a notebook), then the parent exits part-way through.
    script = textwrap.dedent(
        """
        import os, signal, time, torch
        from poptorch_sim.data import AsynchronousDataAccessor
        ds = torch.utils.data.TensorDataset(torch.arange(100))
        keep = AsynchronousDataAccessor(ds, buffer_size=2)
        next(iter(keep))
        killed = AsynchronousDataAccessor(ds, buffer_size=2)
        os.kill(killed._worker._process.pid, signal.SIGINT)
        time.sleep(0.5)
        print("done")
        """
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done" and done.stderr == ""
    assert time.monotonic() - start < 60


# ---- what the fork server imports (see [Note: what the fork server imports]) ----------------
def test_references_name_the_installed_modules_a_dataset_needs(tmp_path: Path) -> None:
    torchvision = pytest.importorskip("torchvision")
    write_standin(tmp_path, num_train=8, num_test=8, variants=1)
    mnist = torchvision.datasets.MNIST(
        str(tmp_path), train=True, transform=torchvision.transforms.ToTensor()
    )
    found = references(mnist)
    assert not found.main
    assert {"torchvision.datasets.mnist", "torchvision.transforms.transforms"} <= set(
        found.libraries
    ), found
    # This suite's own modules and poptorch_sim's are not installed packages' modules.
    assert references(Pids()) == (False, ())


def test_the_fork_server_takes_the_modules_before_it_starts_and_keeps_them_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = multiprocessing.forkserver.ForkServer()
    monkeypatch.setattr(multiprocessing.forkserver, "_forkserver", server)
    preload_in_fork_server(["torchvision.datasets.mnist"])
    preload_in_fork_server(["torchvision.datasets.mnist", "PIL.Image"])
    assert server._preload_modules == [WORKER_MODULE, "torchvision.datasets.mnist", "PIL.Image"]
    server._forkserver_pid = 1  # running: its imports are fixed
    preload_in_fork_server(["numpy"])
    assert "numpy" not in server._preload_modules
