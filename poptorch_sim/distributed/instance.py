"""What each instance runs first: PopRun's environment derived from torchrun's, then the user's program.

torchrun gives each process ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``;
PopRun's ``mpirun`` gave PopTorch programs ``OMPI_COMM_WORLD_*`` (read by a plain
``poptorch.Options()``) and ``POPDIST_*`` (read by ``popdist``). This module sets the latter from
the former, then runs the program as ``__main__``, exactly as ``python program.py args`` would::

    torchrun --nproc-per-node 2 -m poptorch_sim.distributed.instance --num-replicas 4 train.py
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ..cli.program import run_program
from .topology import _int

__all__ = ["main", "popdist_environment"]


def popdist_environment(
    environ: Mapping[str, str], num_replicas: int, ipus_per_replica: int
) -> dict[str, str]:
    """PopRun's variables for the torchrun process described by ``environ``.

    Args:
        environ: the process's environment (torchrun's variables must be set).
        num_replicas: replicas over all instances (``--num-replicas``).
        ipus_per_replica: IPUs per replica (``--ipus-per-replica``).

    Returns:
        The ``OMPI_COMM_WORLD_*`` and ``POPDIST_*`` variables to add.

    Raises:
        ValueError: torchrun's variables are missing, or the replicas do not divide evenly.

    >>> env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    >>> popdist_environment(env, 4, 1)["POPDIST_REPLICA_INDEX_OFFSET"]
    '2'
    """
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    missing = [name for name in names if environ.get(name, "") == ""]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} not set: poptorch_sim.distributed.instance runs under "
            "torchrun (or `python -m poptorch_sim.poprun`), which sets them"
        )
    rank, world, local_rank, local_world = (int(environ[name]) for name in names)
    if num_replicas < 1 or num_replicas % world:
        raise ValueError(
            f"--num-replicas ({num_replicas}) must be a positive multiple of the number of "
            f"instances ({world}): PopRun divides the replicas evenly among the instances"
        )
    local = num_replicas // world
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(world),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_world),
        "POPDIST_NUM_TOTAL_REPLICAS": str(num_replicas),
        "POPDIST_NUM_LOCAL_REPLICAS": str(local),
        "POPDIST_NUM_IPUS_PER_REPLICA": str(ipus_per_replica),
        "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        "POPDIST_REPLICA_INDEX_OFFSET": str(rank * local),
        "POPDIST_LOCAL_INSTANCE_INDEX": str(local_rank),
    }


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m poptorch_sim.distributed.instance",
        description="Run one PopRun instance of a program (under torchrun).",
    )
    parser.add_argument("--num-replicas", type=int, default=None, help="replicas in all")
    parser.add_argument("--ipus-per-replica", type=int, default=1, help="IPUs per replica")
    parser.add_argument("program", help="the Python program to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return parser.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """Set PopRun's environment, then run the program as ``__main__`` (see the module docstring).

    Args:
        argv: ``[--num-replicas N] [--ipus-per-replica K] program [args...]`` (default: sys.argv).
    """
    ns = _parse(sys.argv[1:] if argv is None else argv)
    world = _int("WORLD_SIZE") or 1
    replicas = ns.num_replicas if ns.num_replicas is not None else world
    os.environ.update(popdist_environment(os.environ, replicas, ns.ipus_per_replica))
    run_program(ns.program, ns.args)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
