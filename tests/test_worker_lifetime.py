"""The accessor's worker process never outlives its owner, and no shared memory outlives either
(see [Note: a worker never outlives its owner] and [Note: ring files outlive nobody])."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from poptorch_sim.data import ring

REPO = Path(__file__).resolve().parents[1]

# The owner: a loader whose worker is stuck inside the dataset (sleeping in __getitem__), in
# Python or in C with the interpreter lock held (a ctypes.PyDLL call keeps it).
OWNER = textwrap.dedent(
    """
    import ctypes, sys, time
    import torch
    import poptorch


    class Stuck(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i > 0 and sys.argv[2] == "holding-the-lock":
                ctypes.PyDLL(None).sleep(3600)
            elif i > 0:
                time.sleep(3600)
            return torch.tensor([i])


    if __name__ == "__main__":
        strategy = poptorch.SharingStrategy[sys.argv[1]]
        accessor = poptorch.AsynchronousDataAccessor(
            Stuck(), sharing_strategy=strategy, early_preload=True
        )
        print(accessor._worker._process.pid, flush=True)
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("stuck", ["in-python", "holding-the-lock"])
@pytest.mark.parametrize("strategy", ["ForkServer", "Fork"])
def test_killing_the_owner_ends_a_stuck_worker_and_leaves_no_ring(
    strategy: str, stuck: str, tmp_path: Path
) -> None:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), strategy, stuck],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        worker = int(owner.stdout.readline())  # type: ignore[union-attr]
        assert _running(worker)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(30)
        deadline = time.monotonic() + 30
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(worker), f"worker {worker} outlived its owner"
        assert ring.ring_files(owner.pid) == []
    finally:
        owner.kill()
        owner.wait()


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
