"""Who this process is among PopRun's instances: read once from torchrun's or PopRun's environment.

[Note: instances and replicas]
An *instance* is one process; each holds ``local`` replicas of the model, numbered globally in
instance order (PopRun divides the replicas evenly among the instances)::

    --num-replicas 4 --num-instances 2            global replica = offset + local replica
        instance 0: replicas 0, 1   (offset 0)
        instance 1: replicas 2, 3   (offset 2)

The launcher variables are read here and nowhere else. The instance index and count come from
the first source that is set: torchrun's ``RANK``/``WORLD_SIZE``, then mpirun's
``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (what PopRun's ``mpirun`` sets), then PopRun's
``POPDIST_REPLICA_INDEX_OFFSET // local`` and ``POPDIST_NUM_TOTAL_REPLICAS // local``. The
replica counts come from PopRun's ``POPDIST_*`` variables (one local replica by default).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Instance", "LAUNCHER_VARIABLES", "current_instance", "launched"]

# Variables that show a launcher started this process (``popdist.isPopdistEnvSet``).
LAUNCHER_VARIABLES = ("POPDIST_NUM_TOTAL_REPLICAS", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")


def _int(name: str) -> int | None:
    raw = os.environ.get(name, "")
    if raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _first(*names: str) -> int | None:
    for name in names:
        value = _int(name)
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class Instance:
    """This process's place among the instances (see [Note: instances and replicas]).

    Attributes:
        index: instance index, in ``[0, count)`` (``popdist.getInstanceIndex``).
        count: number of instances (``popdist.getNumInstances``).
        local_index: index of this instance on its host (``popdist.getLocalInstanceIndex``).
        local_replicas: replicas this instance runs (``popdist.getNumLocalReplicas``).
        ipus_per_replica: IPUs each replica spans (``popdist.getNumIpusPerReplica``).
    """

    index: int = 0
    count: int = 1
    local_index: int = 0
    local_replicas: int = 1
    ipus_per_replica: int = 1

    @property
    def total_replicas(self) -> int:
        """Replicas over all instances (``popdist.getNumTotalReplicas``)."""
        return self.count * self.local_replicas

    @property
    def replica_offset(self) -> int:
        """Global index of this instance's first replica (``popdist.getReplicaIndexOffset``)."""
        return self.index * self.local_replicas


def launched() -> bool:
    """Whether a launcher (PopRun, this package's ``poprun``, torchrun or mpirun) started us."""
    return any(os.environ.get(name, "") != "" for name in LAUNCHER_VARIABLES)


def current_instance() -> Instance:
    """This process's ``Instance``, from the environment (one instance when nothing is set).

    Raises:
        ValueError: a variable is not an integer, or the values contradict each other.

    >>> current_instance().count  # outside any launcher
    1
    """
    local = _int("POPDIST_NUM_LOCAL_REPLICAS") or 1
    total = _int("POPDIST_NUM_TOTAL_REPLICAS")
    offset = _int("POPDIST_REPLICA_INDEX_OFFSET")
    count = _first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")
    if count is None:
        count = total // local if total is not None else 1
    index = _first("RANK", "OMPI_COMM_WORLD_RANK")
    if index is None:
        index = offset // local if offset is not None else 0
    local_index = _first(
        "LOCAL_RANK", "POPDIST_LOCAL_INSTANCE_INDEX", "OMPI_COMM_WORLD_LOCAL_RANK"
    )
    instance = Instance(
        index, count, local_index or 0, local, _int("POPDIST_NUM_IPUS_PER_REPLICA") or 1
    )
    _check(instance, total, offset)
    return instance


def _check(instance: Instance, total: int | None, offset: int | None) -> None:
    if not 0 <= instance.index < instance.count:
        raise ValueError(
            f"instance index {instance.index} is outside [0, {instance.count}) (RANK / "
            "OMPI_COMM_WORLD_RANK against WORLD_SIZE / OMPI_COMM_WORLD_SIZE)"
        )
    if total is not None and total != instance.total_replicas:
        raise ValueError(
            f"POPDIST_NUM_TOTAL_REPLICAS={total} but {instance.count} instances x "
            f"{instance.local_replicas} local replicas (POPDIST_NUM_LOCAL_REPLICAS) make "
            f"{instance.total_replicas}: the replicas must divide evenly among the instances"
        )
    if offset is not None and offset != instance.replica_offset:
        raise ValueError(
            f"POPDIST_REPLICA_INDEX_OFFSET={offset} but instance {instance.index} with "
            f"{instance.local_replicas} local replicas starts at replica {instance.replica_offset}"
        )
