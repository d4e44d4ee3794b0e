"""PopDist's API, the launcher's command line and the gradient buckets, in one process."""

from __future__ import annotations

import datetime
import socket
import threading
import time

import pytest
import torch

import popdist
import popdist.poptorch
import poptorch_sim as poptorch
from poptorch_sim import distributed
from poptorch_sim.cli import poprun as launcher
from poptorch_sim.distributed import instance, plan_buckets

_LAUNCH_VARS = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_NUM_IPUS_PER_REPLICA",
    "POPDIST_REPLICA_INDEX_OFFSET", "POPDIST_LOCAL_INSTANCE_INDEX",
]  # fmt: skip


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _answers() -> tuple[bool, int, int, int, int, int, int, int]:
    return (
        popdist.isPopdistEnvSet(),
        popdist.getNumInstances(),
        popdist.getInstanceIndex(),
        popdist.getLocalInstanceIndex(),
        popdist.getNumLocalReplicas(),
        popdist.getNumTotalReplicas(),
        popdist.getReplicaIndexOffset(),
        popdist.getNumIpusPerReplica(),
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (False, 1, 0, 0, 1, 1, 0, 1)),
        # torchrun alone: one replica per process.
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (True, 4, 3, 1, 1, 4, 3, 1)),
        # PopRun's debug log (1 instance, 16 replicas, 4 IPUs each).
        (
            {"POPDIST_NUM_TOTAL_REPLICAS": "16", "POPDIST_NUM_IPUS_PER_REPLICA": "4",
             "POPDIST_NUM_LOCAL_REPLICAS": "16", "POPDIST_REPLICA_INDEX_OFFSET": "0",
             "POPDIST_LOCAL_INSTANCE_INDEX": "0"},
            (True, 1, 0, 0, 16, 16, 0, 4),
        ),
        # PopRun's variables only, instance 2 of 4 (the tutorial's offsets 0/2/4/6).
        (
            {"POPDIST_NUM_TOTAL_REPLICAS": "8", "POPDIST_NUM_LOCAL_REPLICAS": "2",
             "POPDIST_REPLICA_INDEX_OFFSET": "4"},
            (True, 4, 2, 0, 2, 8, 4, 1),
        ),
        # mpirun's variables with PopRun's.
        (
            {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
             "POPDIST_NUM_TOTAL_REPLICAS": "4", "POPDIST_NUM_LOCAL_REPLICAS": "2"},
            (True, 2, 1, 0, 2, 4, 2, 1),
        ),
    ],
    ids=["none", "torchrun", "poprun-log", "popdist-offset", "ompi"],
)  # fmt: skip
def test_popdist_reads_torchrun_and_poprun_variables(
    no_launcher: pytest.MonkeyPatch, env: dict[str, str], expected: tuple
) -> None:
    for name, value in env.items():
        no_launcher.setenv(name, value)
    assert _answers() == expected


def test_popdist_rejects_replicas_that_do_not_divide(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("WORLD_SIZE", "2")
    no_launcher.setenv("RANK", "0")
    no_launcher.setenv("POPDIST_NUM_TOTAL_REPLICAS", "5")
    no_launcher.setenv("POPDIST_NUM_LOCAL_REPLICAS", "2")
    with pytest.raises(ValueError, match="POPDIST_NUM_TOTAL_REPLICAS=5 but 2 instances x 2"):
        popdist.getNumTotalReplicas()


def test_instance_environment_matches_poprun(no_launcher: pytest.MonkeyPatch) -> None:
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    env = instance.popdist_environment(torchrun, num_replicas=4, ipus_per_replica=2)
    assert env["OMPI_COMM_WORLD_RANK"] == "1" and env["OMPI_COMM_WORLD_SIZE"] == "2"
    assert env["POPDIST_NUM_LOCAL_REPLICAS"] == "2"
    assert env["POPDIST_REPLICA_INDEX_OFFSET"] == "2"
    for name, value in {**torchrun, **env}.items():
        no_launcher.setenv(name, value)
    assert _answers() == (True, 2, 1, 1, 2, 4, 2, 2)
    # A plain poptorch.Options() reads mpirun's variables, as under PopRun.
    opts = poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (1, 2)
    with pytest.raises(ValueError, match="positive multiple of the number of instances"):
        instance.popdist_environment(torchrun, num_replicas=3, ipus_per_replica=1)
    with pytest.raises(ValueError, match="RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE not set"):
        instance.popdist_environment({}, num_replicas=1, ipus_per_replica=1)
    no_launcher.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE must be an integer, got 'two'"):
        instance.main(["program.py"])


def test_popdist_options_take_the_launchers_share(no_launcher: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "POPDIST_NUM_LOCAL_REPLICAS": "3",
                        "POPDIST_NUM_IPUS_PER_REPLICA": "2"}.items():  # fmt: skip
        no_launcher.setenv(name, value)
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    assert opts.replication_factor == 3
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (1, 2)
    for call in (
        lambda: opts.replicationFactor(2),
        lambda: opts.useIpuId(1),
        lambda: opts.Distributed.disable(),
        lambda: opts.Distributed.setEnvVarNames("WORLD_SIZE", "RANK"),
        lambda: opts.Distributed.configureProcessId(0, 1),
    ):
        with pytest.raises(RuntimeError, match="with popdist.poptorch.Options"):
            call()
    with pytest.raises(RuntimeError, match="Cannot call `Distributed.disable` with"):
        opts.Distributed.disable()  # PopTorch names the group
    opts._freeze()
    assert opts.toDict()["num_distributed_processes"] == 2
    assert opts._is_frozen
    with pytest.raises(RuntimeError, match="launcher set 2 IPUs per replica"):
        popdist.poptorch.Options(ipus_per_replica=1)
    assert popdist.checkNumIpusPerReplica(2) and not popdist.checkNumIpusPerReplica(4)


def test_popdist_options_outside_a_launcher_are_one_process() -> None:
    opts = popdist.poptorch.Options()
    assert (opts.replication_factor, opts.Distributed.processId) == (1, 0)
    assert opts.Distributed.numProcesses == 1
    # No launcher has chosen the IPUs per replica: the program's value is taken.
    two = popdist.poptorch.Options(ipus_per_replica=2)
    assert two._ipus_per_replica == 2 and two.Distributed.numProcesses == 1
    with pytest.raises(RuntimeError, match="with popdist.poptorch.Options"):
        two.replicationFactor(1)
    assert popdist.execute_on_instances({0}, lambda a, b: a + b, 2, b=3) == 5
    with pytest.raises(ValueError, match=r"instances \[1\] are not in \[0, 1\)"):
        popdist.execute_on_instances({1}, print)


def test_launcher_flags_become_torchrun_arguments() -> None:
    ns = launcher.parse_args(
        ["--num-instances", "2", "--num-replicas", "4", "--ipus-per-replica", "2",
         "--only-output-from-instance", "0", "train.py", "--epochs", "1"]
    )  # fmt: skip
    assert launcher.torchrun_argv(ns) == [
        "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
        "--local-ranks-filter", "0", "-m", "poptorch_sim.distributed.instance",
        "--num-replicas", "4", "--ipus-per-replica", "2", "train.py", "--epochs", "1",
    ]  # fmt: skip
    hint = launcher.multi_host_commands(ns, ["h0", "h1"])
    assert "torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d" in hint
    assert "--rdzv-endpoint h0:29400" in hint
    assert "instance 1: replicas 2-3, 4 simulated IPUs" in launcher.topology(ns)
    with pytest.raises(ValueError, match="divisible by the number of hosts"):
        launcher.multi_host_commands(ns, ["h0", "h1", "h2"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-instances", "2", "--num-replicas", "3", "t.py"], "must be divisible by"),
        (["--num-instances", "0", "t.py"], "--num-instances must be at least 1"),
        (
            [
                "--num-instances",
                "2",
                "--num-replicas",
                "2",
                "--only-output-from-instance",
                "2",
                "t.py",
            ],
            "not in",
        ),
    ],
    ids=["uneven", "zero", "only-output"],
)
def test_launcher_rejects_bad_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        launcher.parse_args(argv)
    assert message in capsys.readouterr().err


def test_launcher_with_several_hosts_prints_torchrun_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = launcher.main(["-H", "a,b", "--num-instances", "4", "--num-replicas", "8", "t.py"])
    err = capsys.readouterr().err
    assert status == 2
    assert "this host only" in err and "--nnodes 2 --nproc-per-node 2" in err


def test_buckets_keep_order_dtype_and_cap() -> None:
    f4 = [torch.zeros(1000) for _ in range(3)]  # 4000 bytes each
    assert plan_buckets(f4, 8000) == [[0, 1], [2]]
    assert plan_buckets(f4, 100) == [[0], [1], [2]]  # larger than the cap: one each
    mixed = [torch.zeros(10), torch.zeros(10, dtype=torch.float16), torch.zeros(10)]
    assert plan_buckets(mixed, 10**6) == [[0, 2], [1]]
    assert plan_buckets([], 10) == []


def test_options_distributed_without_a_process_group_names_the_fix(
    no_launcher: pytest.MonkeyPatch,
) -> None:
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(distributed.DistributedError, match="MASTER_ADDR, MASTER_PORT, RANK"):
        distributed.reducer_for(opts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_peer_that_never_arrives_ends_init_with_a_named_error(
    no_launcher: pytest.MonkeyPatch,
) -> None:
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
                        "RANK": "0", "WORLD_SIZE": "2",
                        "POPTORCH_SIM_DIST_TIMEOUT": "1"}.items():  # fmt: skip
        no_launcher.setenv(name, value)
    assert distributed.timeout() == datetime.timedelta(seconds=1)
    outcome: list[BaseException] = []

    def join() -> None:
        try:
            popdist.init()
        except BaseException as exc:  # noqa: BLE001  (handed to the test thread)
            outcome.append(exc)

    thread = threading.Thread(target=join, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(60)  # a bound for the test, not a speed assertion
    assert not thread.is_alive(), "popdist.init() hung past its 1 s timeout"
    assert len(outcome) == 1 and isinstance(outcome[0], distributed.DistributedError), outcome
    assert isinstance(outcome[0], poptorch.UnrecoverableError)
    assert "process 0 of 2: the other processes did not all join" in str(outcome[0])
    assert "POPTORCH_SIM_DIST_TIMEOUT" in str(outcome[0])
    assert time.monotonic() - start >= 1.0  # it did wait for the peer


class _IdenticalPeer:
    """A stand-in for one more process whose gradients equal ours: all-reduce doubles them."""

    world_size = 2

    def __init__(self) -> None:
        self.calls = 0

    def all_reduce(self, params: list[torch.nn.Parameter]) -> None:
        self.calls += 1
        for p in params:
            if p.grad is not None:
                p.grad.mul_(2)


@pytest.mark.parametrize("reduction", ["Mean", "Sum"])
@pytest.mark.parametrize("pipelined", [False, True], ids=["one-ipu", "pipelined"])
def test_step_reduces_over_processes_and_mean_divides_by_global_replicas(
    monkeypatch: pytest.MonkeyPatch, reduction: str, pipelined: bool
) -> None:
    peer = _IdenticalPeer()
    monkeypatch.setattr("poptorch_sim.executor.training.reducer_for", lambda options: peer)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.b(torch.relu(self.a(x)))
            return out, torch.nn.functional.mse_loss(out, y)

    net = Net()
    eager = Net()
    eager.load_state_dict(net.state_dict())
    opts = poptorch.Options().replicationFactor(2)
    opts.Training.gradientAccumulation(4)
    opts.Training.accumulationAndReplicationReductionType(
        getattr(poptorch.ReductionType, reduction)
    )
    if pipelined:
        net.a = poptorch.BeginBlock(net.a, "B1", ipu_id=0)
        net.b = poptorch.BeginBlock(net.b, "B2", ipu_id=1)
        opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = poptorch.trainingModel(
        net, opts, optimizer=poptorch.optim.SGD(net.parameters(), lr=0.1)
    )
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    model(x, y)
    model.detachFromDevice()
    assert peer.calls == 1
    staged = type(model._executable.program).__name__ == "StagedRunner"
    assert staged == pipelined  # two stages on two IPU threads, or one program
    # Mean over the global 2 x 2 x 4 micro-batches, of which the peer's equal ours, is our mean;
    # Sum counts every micro-batch twice.
    lr = 0.1 if reduction == "Mean" else 0.2
    from oracle import train_reference

    train_reference(eager, torch.optim.SGD(eager.parameters(), lr=lr), (x, y), 1, 4, 2,
                    mean=reduction == "Mean")  # fmt: skip
    torch.testing.assert_close(net.state_dict(), eager.state_dict())


class _WithLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.lin(x)
        return out, poptorch.identity_loss(out.square().sum(), reduction="none")


def test_offline_compile_of_one_process_of_several_joins_no_group(
    no_launcher: pytest.MonkeyPatch,
) -> None:
    # Each process compiles its offline executable alone (no MASTER_ADDR, no peers); the
    # process group is only needed by an executable that runs.
    opts = poptorch.Options().useOfflineIpuTarget().deviceIterations(2)
    opts.Distributed.configureProcessId(3, 6)
    model = _WithLoss()
    before = [p.detach().clone() for p in model.parameters()]
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training.compile(torch.randn(2, 4))
    assert not torch.distributed.is_initialized()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(AssertionError, match="offline device"):
        training(torch.randn(2, 4))
