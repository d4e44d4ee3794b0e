"""The accessor's worker process never outlives its owner, and no shared memory outlives either
(see [Note: a worker never outlives its owner] and [Note: ring files outlive nobody])."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from poptorch_sim.data import ring

REPO = Path(__file__).resolve().parents[1]

# The owner: two loaders whose workers are stuck inside the dataset (sleeping in __getitem__),
# one in Python and one in C with the interpreter lock held (a ctypes.PyDLL call keeps it).
# Each worker's end is checked on its own.
STUCK = ["in-python", "holding-the-lock"]
OWNER = textwrap.dedent(
    """
    import ctypes, sys, time
    import torch
    import poptorch


    class Stuck(torch.utils.data.Dataset):
        def __init__(self, how):
            self.how = how

        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i > 0 and self.how == "holding-the-lock":
                ctypes.PyDLL(None).sleep(3600)
            elif i > 0:
                time.sleep(3600)
            return torch.tensor([i])


    if __name__ == "__main__":
        strategy = poptorch.SharingStrategy[sys.argv[1]]
        kept = []
        for how in sys.argv[2:]:
            kept.append(poptorch.AsynchronousDataAccessor(
                Stuck(how), sharing_strategy=strategy, early_preload=True
            ))
            print(how, kept[-1]._worker._process.pid, kept[-1]._worker._ring, flush=True)
        time.sleep(3600)
    """
)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Ended(NamedTuple):
    """What became of one stuck worker once its owner was killed."""

    pid: int
    ran_before: bool  # it was running before the owner was killed
    outlived: bool  # still running 30 s after the owner's death
    rings: list[str]  # its ring's files left


def _kill_owner(strategy: str, folder: Path) -> dict[str, Ended]:
    script = folder / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), strategy, *STUCK],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    workers: dict[str, tuple[int, str, bool]] = {}
    try:
        for _ in STUCK:
            how, pid, ring_name = owner.stdout.readline().split()  # type: ignore[union-attr]
            workers[how] = (int(pid), ring_name, _running(int(pid)))
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(30)
        deadline = time.monotonic() + 30
        while any(_running(w[0]) for w in workers.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = ring.ring_files(owner.pid)
        return {
            how: Ended(pid, ran, _running(pid), [f for f in left if f"{ring_name}-" in f])
            for how, (pid, ring_name, ran) in workers.items()
        }
    finally:
        owner.kill()
        owner.wait()
        for pid, _, _ in workers.values():
            if _running(pid):  # a worker that outlived its owner: the test has failed
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def killed_owners(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Ended]]:
    """``killed_owners(strategy)``: each stuck worker's end, one owner per strategy."""
    done: dict[str, dict[str, Ended]] = {}

    def get(strategy: str) -> dict[str, Ended]:
        if strategy not in done:
            done[strategy] = _kill_owner(strategy, tmp_path_factory.mktemp(strategy))
        return done[strategy]

    return get


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("stuck", STUCK)
@pytest.mark.parametrize("strategy", ["ForkServer", "Fork"])
def test_killing_the_owner_ends_a_stuck_worker_and_leaves_no_ring(
    strategy: str, stuck: str, killed_owners: Callable[[str], dict[str, Ended]]
) -> None:
    worker = killed_owners(strategy)[stuck]
    assert worker.ran_before
    assert not worker.outlived, f"worker {worker.pid} outlived its owner"
    assert worker.rings == []


def test_rings_of_dead_owners_are_removed_by_the_next_ring(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = f"{ring.RING_PREFIX}{gone.pid}-feedface-0"
    live = f"{ring.RING_PREFIX}{os.getpid()}-feedface-0"
    shm = Path(ring._SHM)
    for name in (dead, live):
        (shm / name).write_bytes(b"x")
    try:
        ring.new_ring_name()
        assert not (shm / dead).exists()
        assert (shm / live).exists()  # its owner (this process) is alive
    finally:
        for name in (dead, live):
            (shm / name).unlink(missing_ok=True)


def test_a_started_ring_has_no_files_left() -> None:
    import torch

    from poptorch_sim.data import AsynchronousDataAccessor

    accessor = AsynchronousDataAccessor(torch.utils.data.TensorDataset(torch.arange(4)))
    try:
        assert ring.ring_files(os.getpid()) == []  # unlinked once the worker had them open
        assert [int(x[0]) for x in accessor] == [0, 1, 2, 3]
    finally:
        accessor.terminate()
    assert ring.ring_files(os.getpid()) == []


def test_a_dataset_that_cannot_be_pickled_names_the_fork_strategy() -> None:
    import torch

    from poptorch_sim.data import AsynchronousDataAccessor
    from poptorch_sim.enums import SharingStrategy
    from poptorch_sim.errors import Error

    class Local(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> torch.Tensor:
            if i >= 2:
                raise IndexError(i)  # iter() over a map-style dataset stops here
            return torch.tensor([i])

    with pytest.raises(Error, match=r"cannot be sent.*poptorch\.SharingStrategy\.Fork") as info:
        AsynchronousDataAccessor(Local())
    assert "Local" in str(info.value)
    assert ring.ring_files(os.getpid()) == []
    accessor = AsynchronousDataAccessor(Local(), sharing_strategy=SharingStrategy.Fork)
    try:
        assert [int(x) for x in accessor] == [0, 1]
    finally:
        accessor.terminate()
