"""Cross-process gradient reduction: one bucketed all-reduce per optimizer step, and the start broadcast.

[Note: replicas across processes]
One ``trainingModel`` step with P processes of R local replicas each (global replication
P x R) does, on every process::

    each local replica accumulates its GA micro-batches' gradients  (worker threads)
    sum over the R local replicas                                   (in the parameter's .grad)
    all_reduce(SUM) over the P processes, in buckets of flat buffers (this module, caller thread)
    divide by GA x R x P for Mean, by 1 for Sum                      (the fused optimizer kernels)
    one optimizer step, identical on every process

so the weights equal those of one process with replication P x R fed the same samples. The
all-reduce runs once per step on the caller's thread, after every stage has finished, so the
collectives are issued in the same order on every process (per-stage steps on the IPU worker
threads are switched off: their order differs from run to run). Buckets are filled in parameter
order up to ``bucket_bytes`` (25 MiB, DistributedDataParallel's default) and all issued before
the first is waited on, so their transfers overlap. The weights start identical everywhere:
process 0's are broadcast when the model is compiled.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .. import env
from .group import DistributedError, timeout

__all__ = ["DEFAULT_BUCKET_BYTES", "GradientReducer", "broadcast_from_first", "plan_buckets"]

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


def plan_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Group ``tensors`` (by index, in order) into buckets of one dtype and device.

    A bucket is closed when the next tensor would take it past ``bucket_bytes``; a tensor larger
    than that gets a bucket of its own.

    >>> t = [torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.half), torch.zeros(9)]
    >>> plan_buckets(t, 32)
    [[0, 1], [2], [3]]
    """
    buckets: list[list[int]] = []
    open_by_key: dict[tuple[Any, ...], tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        size = t.numel() * t.element_size()
        bucket, used = open_by_key.get(key, (None, 0))
        if bucket is None or used + size > bucket_bytes:
            bucket, used = [], 0
            buckets.append(bucket)
        bucket.append(i)
        open_by_key[key] = (bucket, used + size)
    return buckets


class GradientReducer:
    """Sums the parameters' gradients over all processes (see [Note: replicas across processes]).

    Args:
        bucket_bytes: the most bytes one all-reduce carries (default 25 MiB).
        group: the process group (default: the world).

    Attributes:
        bytes_per_step: bytes of gradient this process all-reduced in the last step.
        steps: all-reduces done. ``seconds``: time spent in them.
    """

    def __init__(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, group: Any = None) -> None:
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.bytes_per_step = 0
        self.steps = 0
        self.seconds = 0.0

    def all_reduce(self, params: Sequence[nn.Parameter]) -> None:
        """Replace each gradient of ``params`` by its sum over the processes.

        Raises:
            DistributedError: a peer process died or did not take part within the timeout.
        """
        grads = [p.grad for p in params if p.grad is not None]
        start = time.perf_counter()
        pending = []
        try:
            for bucket in plan_buckets(grads, self.bucket_bytes):
                tensors = [grads[i] for i in bucket]
                flat = torch._utils._flatten_dense_tensors(tensors)
                work = dist.all_reduce(flat, group=self.group, async_op=True)
                pending.append((work, flat, tensors))
            for work, flat, tensors in pending:
                work.wait(timeout())
                for dst, src in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors)):
                    dst.copy_(src)
        except Exception as exc:
            raise self._failure(time.perf_counter() - start, exc) from exc
        self.bytes_per_step = sum(g.numel() * g.element_size() for g in grads)
        self.steps += 1
        self.seconds += time.perf_counter() - start

    def _failure(self, waited: float, exc: BaseException) -> DistributedError:
        return DistributedError(
            f"process {self.rank} of {self.world_size}: the gradient all-reduce of step "
            f"{self.steps + 1} failed after {waited:.1f} s: a peer process exited or stopped "
            f"taking part (every wait is bounded by POPTORCH_SIM_DIST_TIMEOUT="
            f"{env.dist_timeout():g} s; the launcher's summary names the process that failed). "
            f"Cause: {type(exc).__name__}: {exc}"
        )


def broadcast_from_first(module: nn.Module) -> None:
    """Give every process process 0's parameters and buffers (one flat broadcast per dtype).

    Raises:
        DistributedError: a peer process died or did not take part within the timeout.
    """
    with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
        # Plain views of the (possibly host-sync-wrapped) tensors, sharing their storage.
        tensors = list({id(t): t.detach() for t in _state(module)}.values())
        start = time.perf_counter()
        try:
            for bucket in plan_buckets(tensors, DEFAULT_BUCKET_BYTES):
                chosen = [tensors[i] for i in bucket]
                flat = torch._utils._flatten_dense_tensors(chosen)
                dist.broadcast(flat, src=0, async_op=True).wait(timeout())
                for dst, src in zip(chosen, torch._utils._unflatten_dense_tensors(flat, chosen)):
                    dst.copy_(src)
        except Exception as exc:
            raise DistributedError(
                f"process {dist.get_rank()} of {dist.get_world_size()}: broadcasting process "
                f"0's weights failed after {time.perf_counter() - start:.1f} s: a peer process "
                f"exited or stopped taking part. Cause: {type(exc).__name__}: {exc}"
            ) from exc


def _state(module: nn.Module) -> list[torch.Tensor]:
    return [p for p in module.parameters()] + [b for b in module.buffers()]
