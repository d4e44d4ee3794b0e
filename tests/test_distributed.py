"""Two processes on this machine (gloo, loopback): the same weights as one process, PopTorch's
shards, a dead peer that ends the survivor with a named error, the tutorial under the launcher.

Every child process runs under a ``subprocess`` timeout and ``POPTORCH_SIM_DIST_TIMEOUT``, so a
failure shows as an error, never as a hung test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import distributed_program as program
import pytest
import torch
from oracle import train_reference

import poptorch_sim as poptorch
from poptorch_sim.datasets import write_standin

REPO = Path(__file__).resolve().parent.parent
PROGRAM = Path(program.__file__)
PIPELINE = REPO / "tutorials" / "pipelining" / "mnist_pipeline.py"
CHILD_TIMEOUT = 300  # seconds: importing torch alone takes ~10 s on a loaded two-core machine
DIST_TIMEOUT = "30"
ROWS_PER_PROCESS = 32  # 16 rows per call x floor(80 / (16 x 2)) calls: the last 16 rows drop


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "OMPI_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        POPTORCH_SIM_OFFLINE="1",
        POPTORCH_SIM_DIST_TIMEOUT=DIST_TIMEOUT,
        OMP_NUM_THREADS="1",
        **extra,
    )
    return env


def _poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "poptorch_sim.poprun", *args],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=CHILD_TIMEOUT,
    )  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"poprun {' '.join(args)} exited with {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")  # fmt: skip
    return proc


# ---- two instances train as one process with the same global replication ----------------------
@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One launch of 2 instances: the training runs, then the tutorial (output tagged)."""
    out = tmp_path_factory.mktemp("instances")
    data = out / "mnist"
    write_standin(data, num_train=512, num_test=256, variants=2)
    proc = _poprun(
        "--num-instances", "2", "--num-replicas", "4", "--ipus-per-replica", "2",
        "--tag-output", str(PROGRAM), "train", str(out), str(data), cwd=out,
    )  # fmt: skip
    assert "torchrun --nnodes 2 --nproc-per-node 1" in proc.stderr  # the several-hosts hint
    return out, proc.stdout


@pytest.fixture(scope="module")
def trained(launched: tuple[Path, str]) -> list[dict[str, Any]]:
    return [torch.load(launched[0] / f"instance{i}.pt") for i in range(2)]


def test_popdist_answers_under_the_launcher(trained: list[dict[str, Any]]) -> None:
    for index, result in enumerate(trained):
        assert result["popdist"] == {
            "isPopdistEnvSet": True,
            "getNumInstances": 2,
            "getInstanceIndex": index,
            "getNumTotalReplicas": 4,
            "getNumLocalReplicas": 2,
            "getReplicaIndexOffset": 2 * index,
            "getNumIpusPerReplica": 2,
        }
        assert result["plain_options_process"] == (index, 2)


def test_each_process_reads_its_contiguous_block(trained: list[dict[str, Any]]) -> None:
    # Combined batch 16 (mb 2 x DI 2 x GA 2 x 2 local replicas), 80 rows, 2 processes:
    # process p reads rows [32p, 32p + 32) in order; rows 64-79 are dropped.
    for p, result in enumerate(trained):
        block = list(range(ROWS_PER_PROCESS * p, ROWS_PER_PROCESS * (p + 1)))
        assert result["plain"]["rows"] == [block[:16], block[16:]]


def test_shuffled_blocks_follow_the_seeded_global_permutation(
    trained: list[dict[str, Any]],
) -> None:
    perm = torch.randperm(program.ROWS, generator=torch.Generator().manual_seed(7)).tolist()
    leftover = program.ROWS - 2 * ROWS_PER_PROCESS
    for p, result in enumerate(trained):
        # The first shuffled epoch slides every block by the leftover count (PopTorch's
        # swap_range), so the rows dropped in one epoch are read in the next.
        start = ROWS_PER_PROCESS * p + leftover
        block = perm[start : start + ROWS_PER_PROCESS]
        assert result["piped"]["rows"] == [block[:16], block[16:]]


def _global_batches(trained: list[dict[str, Any]], key: str, di: int, ga: int) -> list[Any]:
    """One process's calls, with global replica p x R + r reading process p's replica r."""
    data = program.dataset().tensors
    calls = []
    for c in range(len(trained[0][key]["rows"])):
        views = [torch.tensor(r[key]["rows"][c]).reshape(di, ga, 2, -1) for r in trained]
        rows = torch.cat(views, dim=2).reshape(-1)
        calls.append((data[0][rows], data[1][rows]))
    return calls


def test_weights_equal_one_process_with_four_replicas(trained: list[dict[str, Any]]) -> None:
    start = trained[0]["start"]
    assert not torch.equal(trained[1]["start"]["fc1.weight"], start["fc1.weight"])
    calls = _global_batches(trained, "plain", di=2, ga=2)

    one = program.Plain()
    one.load_state_dict(start)
    opts = poptorch.Options().replicationFactor(4).deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    model = poptorch.trainingModel(
        one, opts, optimizer=poptorch.optim.SGD(one.parameters(), lr=0.1, momentum=0.9)
    )
    for x, y in calls:
        model(x, y)
    model.detachFromDevice()

    eager = program.Plain()
    eager.load_state_dict(start)
    sgd = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    for x, y in calls:
        train_reference(eager, sgd, (x, y), di=2, ga=2, r=4)

    for result in trained:
        weights = result["plain"]["weights"]
        torch.testing.assert_close(weights, one.state_dict())
        torch.testing.assert_close(weights, eager.state_dict())


def test_pipelined_replicas_over_processes_equal_one_process(
    trained: list[dict[str, Any]],
) -> None:
    one = program.Piped()
    one.load_state_dict(trained[0]["piped_start"])  # process 0's, broadcast to all
    opts = poptorch.Options().replicationFactor(4)
    opts.Training.gradientAccumulation(4)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    opts.setExecutionStrategy(
        poptorch.PipelinedExecution(poptorch.Stage("B1").ipu(0), poptorch.Stage("B2").ipu(1))
    )
    model = poptorch.trainingModel(
        one, opts, optimizer=poptorch.optim.AdamW(one.parameters(), lr=0.01)
    )
    for x, y in _global_batches(trained, "piped", di=1, ga=4):
        model(x, y)
    model.detachFromDevice()
    for result in trained:
        torch.testing.assert_close(result["piped"]["weights"], one.state_dict())


# ---- a dead peer ends the survivor --------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_killed_peer_ends_the_other_process_with_a_named_error(tmp_path: Path) -> None:
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")  # fmt: skip
        cmd = [sys.executable, "-m", "poptorch_sim.distributed.instance", "--num-replicas", "4",
               str(PROGRAM), "die"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    try:
        _, err1 = procs[1].communicate(timeout=CHILD_TIMEOUT)
        died = time.monotonic()
        out0, err0 = procs[0].communicate(timeout=CHILD_TIMEOUT)
        ended = time.monotonic()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert procs[1].returncode == -9, err1[-3000:]
    assert procs[0].returncode != 0, out0[-2000:]
    assert "DistributedError: process 0 of 2: the gradient all-reduce of step" in err0, err0[
        -4000:
    ]
    assert "a peer process exited or stopped taking part" in err0
    # The survivor noticed within the collective timeout (not a speed assertion: a bound on
    # waiting, which is the behaviour under test).
    assert ended - died < float(DIST_TIMEOUT), (ended - died, err0[-2000:])


# ---- destroy_process_group ends the group's threads ---------------------------------------------
# One process joins a world of one, makes a torch.optim optimizer (which imports torch._dynamo and
# with it torch.distributed.nn.functional), destroys the group and lists its gloo threads left.
_GROUP_THREADS = """
import os, sys, torch, torch.distributed as dist
if sys.argv[1] == "poptorch_sim":
    from poptorch_sim.distributed import init_process_group
    init_process_group()
else:
    dist.init_process_group("gloo")
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
dist.destroy_process_group()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(sorted(n for n in names if "gloo" in n))
"""


def _gloo_threads_left(joined_by: str) -> str:
    """The gloo threads left after ``_GROUP_THREADS`` ran with its group joined by ``joined_by``."""
    env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    proc = subprocess.run(
        [sys.executable, "-c", _GROUP_THREADS, joined_by], env=env, text=True,
        capture_output=True, timeout=CHILD_TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lists threads in /proc")
def test_destroying_the_group_joins_its_threads() -> None:
    """See [Note: the world group outlives destroy_process_group] in distributed/group.py."""
    assert _gloo_threads_left("poptorch_sim") == "[]"


# Slow: a control, not poptorch_sim's behaviour (a process of its own, 4-6 s of CPU): torch's
# own group, joined before the import, keeps its threads, which is what the note works around.
# scripts/test.sh --all runs it.
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="lists threads in /proc")
def test_torch_alone_leaves_the_threads_that_the_note_works_around() -> None:
    assert "pt_gloo_runloop" in _gloo_threads_left("torch")


# ---- the MNIST pipelining tutorial under the launcher -------------------------------------------
def test_pipelining_tutorial_runs_in_two_instances(launched: tuple[Path, str]) -> None:
    stdout = launched[1]
    for rank in range(2):
        assert f"[1,{rank}]<stdio>:Training..." in stdout
        lines = [line for line in stdout.splitlines()
                 if line.startswith(f"[1,{rank}]<stdio>:Accuracy on test set:")]  # fmt: skip
        assert len(lines) == 1, stdout[-3000:]


# Slow: a third launch of two instances (each imports torch and compiles the tutorial's model);
# the tutorial's main already runs in the two launched instances of the tests above, so CI keeps
# what this checks except the script's own argument parsing. scripts/test.sh --all runs it.
@pytest.mark.slow
def test_pipelining_tutorial_is_the_launched_program(tmp_path: Path) -> None:
    data = tmp_path / "mnist"
    write_standin(data, num_train=512, num_test=256, variants=2)
    proc = _poprun(
        "--num-instances", "2", "--num-replicas", "2", "--only-output-from-instance", "1",
        str(PIPELINE), *program.TUTORIAL_FLAGS, "--data-dir", str(data), cwd=tmp_path,
    )  # fmt: skip
    assert "Accuracy on test set:" in proc.stdout
