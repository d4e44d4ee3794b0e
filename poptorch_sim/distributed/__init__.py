"""PopRun/PopDist on torch.distributed: instances, the process group, cross-process gradient reduction.

A PopTorch program written for PopRun runs as several processes (*instances*), each with its own
replicas; the DataLoader gives each process its contiguous block of the data set
(``poptorch_sim/data/process_block.py``) and every optimizer step sums the gradients over all of
them (see [Note: replicas across processes] in ``allreduce.py``). ``python -m poptorch_sim.poprun``
starts the instances on this host through torch's elastic launcher (what ``torchrun`` runs);
``popdist`` (a top-level package) holds PopDist's API.

The executor reaches this package through two hooks, both no-ops for one process:
``reducer_for(options)`` when it builds the trainer and ``synchronize_weights(model, options)``
when it compiles a training model.

Simulated: on IPUs the gradients cross instances on the device (GCL over IPU-Links); here they
cross on the host, through torch.distributed (gloo for CPU tensors, NCCL for CUDA ones).
PopTorch does not broadcast weights (programs seed alike or call ``hvd.broadcast_parameters``);
here a training model takes process 0's weights when it is compiled (except for an offline
target, which never runs and so joins no group), so every process starts alike either way. ``ReductionType.Mean`` divides by the *global* count of micro-batches
(GA x local replicas x processes), so P processes of R replicas train exactly as one process of
P x R replicas; PopTorch's documentation does not say which count it divides by.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .allreduce import DEFAULT_BUCKET_BYTES, GradientReducer, broadcast_from_first, plan_buckets
from .group import DistributedError, backend, ensure_group, init_process_group, timeout
from .topology import Instance, current_instance, launched

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DistributedError",
    "GradientReducer",
    "Instance",
    "backend",
    "broadcast_from_first",
    "current_instance",
    "ensure_group",
    "init_process_group",
    "launched",
    "plan_buckets",
    "reducer_for",
    "synchronize_weights",
    "timeout",
]


def reducer_for(options: Any) -> GradientReducer | None:
    """The cross-process gradient reducer for a model with these options (None: one process).

    Args:
        options: the model's ``poptorch.Options``.

    Raises:
        DistributedError: the process group cannot be joined or disagrees with the options.
    """
    processes = options.Distributed.numProcesses
    if processes == 1:
        return None
    ensure_group(options.Distributed.processId, processes)
    return GradientReducer()


def synchronize_weights(model: nn.Module, options: Any) -> None:
    """Start every process from process 0's weights (a training model, when compiled).

    Args:
        model: the user's model.
        options: the model's ``poptorch.Options``.
    """
    if options.Distributed.numProcesses == 1:
        return
    ensure_group(options.Distributed.processId, options.Distributed.numProcesses)
    broadcast_from_first(model)
