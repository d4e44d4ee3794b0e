"""``python -m poptorch_sim.poprun``: PopRun's command line, launching instances with torchrun's engine.

PopRun starts ``--num-instances`` processes with ``mpirun`` and divides ``--num-replicas``
evenly among them. Here the processes are started on this host by torch.distributed's elastic
agent (``torch.distributed.run``, what ``torchrun`` runs), each through
``poptorch_sim.distributed.instance``, which gives it PopRun's environment. The launcher prints
the ``torchrun --nnodes`` command that runs the same program over several hosts::

    python -m poptorch_sim.poprun --num-instances 2 --num-replicas 4 train.py --epochs 1

If a process fails, the agent stops the others and the launcher exits with status 1 after
printing torchrun's summary, which names the failed rank and its exit code.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

__all__ = ["DEFAULT_RDZV_PORT", "main", "multi_host_commands", "parse_args", "torchrun_argv"]

DEFAULT_RDZV_PORT = 29400
_INSTANCE = "poptorch_sim.distributed.instance"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """PopRun's flags (the subset that means something without IPU hardware).

    Raises:
        SystemExit: bad flags, or replicas that do not divide evenly among the instances.
    """
    parser = argparse.ArgumentParser(
        prog="python -m poptorch_sim.poprun",
        description="PopRun for poptorch_sim: run a program as several instances (processes) "
        "that share the replicas, on torch.distributed.",
    )
    add = parser.add_argument
    add("--num-instances", type=int, default=1, help="processes to start (default: 1)")
    add("--num-replicas", type=int, default=1, help="replicas over all instances (default: 1)")
    add("--ipus-per-replica", type=int, default=1, help="IPUs per replica (default: 1)")
    add("-H", "--host", default=None, help="hosts, comma-separated (default: this host)")
    add("--only-output-from-instance", type=int, default=None, help="show one instance's output")
    add("--tag-output", action="store_true", help="prefix each line with [1,<rank>]<stdio>:")
    add("--print-topology", action="store_true", help="print which instance holds which replica")
    add("--executable-cache-path", default=None, help="sets POPTORCH_CACHE_DIR for every instance")
    add("--offline-mode", action="store_true", help="accepted; simulation needs no IPUs anyway")
    add("--rdzv-port", type=int, default=DEFAULT_RDZV_PORT, help="port in the printed hint")
    add("-v", "--verbose", action="count", default=0, help="show torchrun's own log")
    add("program", help="the program to run (a Python file)")
    add("args", nargs=argparse.REMAINDER, help="the program's arguments")
    ns = parser.parse_args(argv)
    for name in ("num_instances", "num_replicas", "ipus_per_replica"):
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(ns, name)}")
    if ns.num_replicas % ns.num_instances:
        parser.error(
            f"--num-replicas ({ns.num_replicas}) must be divisible by --num-instances "
            f"({ns.num_instances}): the replicas are divided evenly among the instances"
        )
    only = ns.only_output_from_instance
    if only is not None and not 0 <= only < ns.num_instances:
        parser.error(f"--only-output-from-instance {only} is not in [0, {ns.num_instances})")
    return ns


def _instance_argv(ns: argparse.Namespace) -> list[str]:
    return [
        "-m", _INSTANCE, "--num-replicas", str(ns.num_replicas),
        "--ipus-per-replica", str(ns.ipus_per_replica), ns.program, *ns.args,
    ]  # fmt: skip


def torchrun_argv(ns: argparse.Namespace) -> list[str]:
    """torchrun's arguments that start all of ``ns``'s instances on this host.

    >>> torchrun_argv(parse_args(["--num-instances", "2", "--num-replicas", "4", "t.py"]))[:5]
    ['--standalone', '--nnodes', '1', '--nproc-per-node', '2']
    """
    argv = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(ns.num_instances)]
    argv += ["--max-restarts", "0"]
    if ns.only_output_from_instance is not None:
        argv += ["--local-ranks-filter", str(ns.only_output_from_instance)]
    if ns.tag_output:
        argv += ["--tee", "3", "--log-line-prefix-template", "[1,${rank}]<stdio>:"]
    return argv + _instance_argv(ns)


def multi_host_commands(ns: argparse.Namespace, hosts: list[str]) -> str:
    """The command to run on each of ``hosts`` for the same job (the first host is the store).

    Raises:
        ValueError: the instances do not divide evenly among the hosts.
    """
    if ns.num_instances % len(hosts):
        raise ValueError(
            f"--num-instances ({ns.num_instances}) must be divisible by the number of hosts "
            f"({len(hosts)}): the instances are divided evenly among the hosts"
        )
    argv = [
        "torchrun", "--nnodes", str(len(hosts)),
        "--nproc-per-node", str(ns.num_instances // len(hosts)),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts[0]}:{ns.rdzv_port}",
        "--rdzv-id", "poprun", "--max-restarts", "0", *_instance_argv(ns),
    ]  # fmt: skip
    return f"on each of {', '.join(hosts)} (same program and data paths):\n  " + shlex.join(argv)


def topology(ns: argparse.Namespace) -> str:
    """Which instance holds which global replicas and IPUs (``--print-topology``)."""
    local = ns.num_replicas // ns.num_instances
    lines = [
        f"{ns.num_replicas} replicas x {ns.ipus_per_replica} IPUs, {ns.num_instances} instances"
    ]
    for i in range(ns.num_instances):
        replicas = range(i * local, (i + 1) * local)
        lines.append(
            f"  instance {i}: replicas {replicas.start}-{replicas.stop - 1}, "
            f"{local * ns.ipus_per_replica} simulated IPUs (replica offset {replicas.start})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Start the instances on this host and wait for them; returns the exit status.

    Args:
        argv: PopRun's command line without the program name (default: ``sys.argv[1:]``).
    """
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    hosts = [h for h in (ns.host or "").split(",") if h]
    if ns.print_topology:
        print(topology(ns), file=sys.stderr)
    if len(hosts) > 1:
        print(
            "poprun (poptorch_sim) starts instances on this host only. To run over several "
            f"hosts, run {multi_host_commands(ns, hosts)}",
            file=sys.stderr,
        )
        return 2
    argv_here = torchrun_argv(ns)
    print(
        f"poprun (poptorch_sim): {ns.num_instances} instance(s) x "
        f"{ns.num_replicas // ns.num_instances} replica(s) on this host: torchrun "
        f"{shlex.join(argv_here)}\nOver several hosts, run "
        f"{multi_host_commands(ns, ['HOST0', 'HOST1'] if ns.num_instances % 2 == 0 else ['HOST0'])}",
        file=sys.stderr,
    )
    if ns.executable_cache_path:
        os.environ["POPTORCH_CACHE_DIR"] = ns.executable_cache_path
    if ns.num_instances > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning
    return _run_torchrun(argv_here, ns.verbose)


def _run_torchrun(argv: list[str], verbose: int) -> int:
    import logging

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not verbose:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    try:
        torchrun.run(torchrun.get_args_parser().parse_args(argv))
    except ChildFailedError as failure:
        print(failure.format_msg(), file=sys.stderr)
        return 1
    return 0
