"""``popdist.poptorch.Options``: ``poptorch.Options`` set up for this instance's share of the replicas."""

from __future__ import annotations

from typing import Any, NoReturn

import poptorch_sim
from poptorch_sim.distributed import current_instance, launched
from poptorch_sim.options.groups import _DistributedOptions

__all__ = ["Options"]


def _refuse(name: str) -> NoReturn:
    raise RuntimeError(f"Cannot call `{name}` with popdist.poptorch.Options")


class _PopdistDistributedOptions(_DistributedOptions):
    """``opts.Distributed`` of a ``popdist.poptorch.Options``: fixed by the launcher."""

    def disable(self) -> NoReturn:  # type: ignore[override]  # noqa: D102
        _refuse("Distributed.disable")

    def setEnvVarNames(self, *args: Any) -> NoReturn:  # type: ignore[override]  # noqa: D102
        _refuse("Distributed.setEnvVarNames")

    def configureProcessId(self, *args: Any) -> NoReturn:  # type: ignore[override]  # noqa: D102
        _refuse("Distributed.configureProcessId")


class Options(poptorch_sim.Options):
    """``poptorch.Options`` with the local replication factor and the process id and count
    taken from the launcher (outside one: 1 replica, process 0 of 1).

    ``replicationFactor``, ``useIpuId`` and the ``Distributed`` setters raise ``RuntimeError``:
    the launcher decides them.

    Args:
        ipus_per_replica: IPUs each replica spans (default: the launcher's
            ``--ipus-per-replica``).

    Raises:
        RuntimeError: ``ipus_per_replica`` differs from the launcher's ``--ipus-per-replica``
            (without a launcher, any value is taken).

    >>> opts = Options()
    >>> opts.replication_factor, opts.Distributed.numProcesses
    (1, 1)
    """

    def __init__(self, ipus_per_replica: int | None = None) -> None:
        super().__init__()
        instance = current_instance()
        # Without a launcher nothing has chosen the IPUs per replica yet: the program does.
        mismatch = ipus_per_replica is not None and ipus_per_replica != instance.ipus_per_replica
        if mismatch and launched():
            raise RuntimeError(
                f"popdist.poptorch.Options(ipus_per_replica={ipus_per_replica}) but the launcher "
                f"set {instance.ipus_per_replica} IPUs per replica (--ipus-per-replica)"
            )
        self.set(replication_factor=instance.local_replicas)
        self.Distributed.configureProcessId(instance.index, instance.count)
        object.__setattr__(self.Distributed, "__class__", _PopdistDistributedOptions)
        self._ipus_per_replica = (
            instance.ipus_per_replica
            if ipus_per_replica is None or launched()
            else ipus_per_replica
        )

    def replicationFactor(self, replication_factor: int) -> NoReturn:  # type: ignore[override]
        """Refused: the launcher sets the local replication factor."""
        _refuse("replicationFactor")

    def useIpuId(self, ipu_id: int) -> NoReturn:  # type: ignore[override]
        """Refused: the launcher chooses the devices."""
        _refuse("useIpuId")
