"""``popdist``: PopDist's Python API, answered from torchrun's or PopRun's environment.

Programs written for PopRun call these to learn which instance they are and how the replicas
are divided; ``popdist.poptorch.Options`` configures a model for its share. Instances are
processes started by ``python -m poptorch_sim.poprun`` (or ``torchrun``); see
[Note: instances and replicas] in ``poptorch_sim/distributed/topology.py``.

>>> import popdist
>>> popdist.getNumInstances(), popdist.getInstanceIndex()  # outside any launcher
(1, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch.distributed as dist

from poptorch_sim.distributed import DistributedError, current_instance, init_process_group
from poptorch_sim.distributed import launched as _launched
from poptorch_sim.distributed import timeout as _timeout

__all__ = [
    "checkNumIpusPerReplica",
    "execute_on_instances",
    "getInstanceIndex",
    "getLocalInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getReplicaIndexOffset",
    "init",
    "isPopdistEnvSet",
]


def init() -> None:
    """Join the other instances (torch.distributed's process group); a no-op for one instance.

    Raises:
        poptorch_sim.distributed.DistributedError: the others did not all join within
            ``POPTORCH_SIM_DIST_TIMEOUT`` seconds.
    """
    if _launched() and current_instance().count > 1:
        init_process_group()


def isPopdistEnvSet() -> bool:
    """Whether a launcher (``poptorch_sim.poprun``, PopRun, torchrun) started this process."""
    return _launched()


def getNumInstances() -> int:
    """Number of instances (processes)."""
    return current_instance().count


def getInstanceIndex() -> int:
    """Index of this instance, in ``[0, getNumInstances())``."""
    return current_instance().index


def getLocalInstanceIndex() -> int:
    """Index of this instance among those on its host."""
    return current_instance().local_index


def getNumLocalReplicas() -> int:
    """Replicas this instance runs (1 outside a launcher)."""
    return current_instance().local_replicas


def getNumTotalReplicas() -> int:
    """Replicas over all instances."""
    return current_instance().total_replicas


def getReplicaIndexOffset() -> int:
    """Global index of this instance's first replica."""
    return current_instance().replica_offset


def getNumIpusPerReplica() -> int:
    """IPUs each replica spans (1 by default)."""
    return current_instance().ipus_per_replica


def checkNumIpusPerReplica(num_ipus_per_replica: int) -> bool:
    """False if the launcher set a different number of IPUs per replica."""
    return current_instance().ipus_per_replica == num_ipus_per_replica


def execute_on_instances(
    instances: Iterable[int], func: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Run ``func(*args, **kwargs)`` on the given instances only, then wait for all instances.

    Typically ``execute_on_instances({0}, save_checkpoint, path)``: the others wait at a
    barrier (bounded by ``POPTORCH_SIM_DIST_TIMEOUT``) until it is written.

    Simulated: collectives called inside ``func`` are not limited to ``instances``.

    Returns:
        ``func``'s result on the chosen instances, None on the others.

    Raises:
        ValueError: an instance index is out of range.
        poptorch_sim.distributed.DistributedError: an instance did not reach the barrier.
    """
    chosen = set(instances)
    instance = current_instance()
    bad = sorted(i for i in chosen if not 0 <= i < instance.count)
    if bad:
        raise ValueError(f"instances {bad} are not in [0, {instance.count})")
    result = func(*args, **kwargs) if instance.index in chosen else None
    if instance.count > 1:
        init_process_group()
        try:
            dist.monitored_barrier(timeout=_timeout())
        except RuntimeError as exc:
            raise DistributedError(
                f"process {instance.index} of {instance.count}: not every instance reached the "
                f"barrier after execute_on_instances({sorted(chosen)}): {exc}"
            ) from exc
    return result


from . import poptorch  # noqa: E402, F401  (popdist.poptorch.Options after `import popdist`)
