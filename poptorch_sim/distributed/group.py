"""The torch.distributed process group that all instances' replicas reduce over, joined once.

Every wait on other processes is bounded by ``POPTORCH_SIM_DIST_TIMEOUT`` (``env.dist_timeout``):
joining the group, each all-reduce, each barrier. A peer that never starts or dies part-way
ends each survivor with a ``DistributedError`` that names the survivor's rank, the wait and the
cause, instead of a hang.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

# [Note: the world group outlives destroy_process_group]
# torch.distributed.nn.functional binds ``group.WORLD`` as its functions' default arguments when
# it is imported. Imported after the group is joined (torch._dynamo imports it, and the first
# torch.optim optimizer imports torch._dynamo), those defaults hold the world group after
# destroy_process_group, and its gloo threads run on until interpreter teardown destroys it
# (where an instance of benchmarks/scale_out.py once aborted: "terminate called without an
# active exception"). Imported here, before any group exists, the defaults are None:
# destroy_process_group frees the group and joins its threads.
import torch.distributed.nn.functional  # noqa: F401  (see the note above)

from .. import env
from ..errors import UnrecoverableError
from .topology import current_instance

__all__ = ["DistributedError", "backend", "ensure_group", "init_process_group", "timeout"]

# What torch.distributed's env:// rendezvous needs (torchrun sets all four).
_RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


class DistributedError(UnrecoverableError):
    """Work across processes failed: a peer died, never arrived, or the setup disagrees.

    As with PopTorch's ``UnrecoverableError``, the process must be restarted (the launcher
    ends the other instances).
    """


def timeout() -> datetime.timedelta:
    """The bound on every wait on other processes (``POPTORCH_SIM_DIST_TIMEOUT``)."""
    return datetime.timedelta(seconds=env.dist_timeout())


def backend() -> str:
    """gloo for CPU tensors, plus NCCL for CUDA tensors where this machine has both."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init_process_group() -> None:
    """Join the process group of all instances, from torchrun's variables (idempotent).

    Raises:
        DistributedError: the rendezvous variables are missing, or the other processes did not
            all join within the timeout.
    """
    if dist.is_initialized():
        return
    missing = [name for name in _RENDEZVOUS_VARIABLES if os.environ.get(name, "") == ""]
    if missing:
        raise DistributedError(
            f"cannot join the other processes: {', '.join(missing)} not set. Launch the program "
            "with `python -m poptorch_sim.poprun --num-instances N ...` or torchrun, or call "
            "torch.distributed.init_process_group() before compiling the model"
        )
    instance = current_instance()
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        dist.init_process_group(backend(), timeout=timeout())
    except Exception as exc:  # DistStoreError, DistNetworkError, RuntimeError from gloo
        raise DistributedError(
            f"process {instance.index} of {instance.count}: the other processes did not all "
            f"join at {where} within {env.dist_timeout():g} s (POPTORCH_SIM_DIST_TIMEOUT): a "
            f"process did not start, died while starting, or cannot reach {where}. "
            f"Cause: {type(exc).__name__}: {exc}"
        ) from exc


def ensure_group(process_id: int, num_processes: int) -> None:
    """Join the group if needed and check that it is the one ``Options.Distributed`` describes.

    Args:
        process_id: ``Options.Distributed.processId``.
        num_processes: ``Options.Distributed.numProcesses``.

    Raises:
        DistributedError: the group's rank or size differ from the options'.
    """
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) != (process_id, num_processes):
        raise DistributedError(
            f"Options.Distributed says process {process_id} of {num_processes} but "
            f"torch.distributed says rank {rank} of {world}: configure the options from the "
            "same launcher (popdist.poptorch.Options(), or "
            "opts.Distributed.setEnvVarNames('WORLD_SIZE', 'RANK') under torchrun)"
        )
