"""Chunk iteration of the generic optimizer kernels, with off-chip state streamed per chunk.

[Note: generic off-chip streaming]
The generic kernels keep the C++ contract of [Note: off-chip optimizer state]: with
``chunk_elements > 0`` each state tensor lives in host memory (``FusedOptimizer`` allocates it
on the CPU, pinned when the parameter is on CUDA) and is streamed through the device in chunks
of ``chunk_elements``::

    for chunk in param:                 host ──copy──► device        bytes_to_device += chunk
        update(param[chunk], grad[chunk], staged state)
        staged state ──copy──► host                                  bytes_to_host   += chunk

Every element meets the same arithmetic whatever the chunking, so streamed and on-chip
updates give identical results. The counters here add to the C++ ones in
:func:`poptorch_sim.kernels.optim.offload_stats`. With ``chunk_elements == 0`` the whole
parameter is one chunk and its state is used where it lives (copied only if it is on another
device than the parameter, and then not counted as streaming).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import NamedTuple

from torch import Tensor

__all__ = ["Chunk", "chunks", "reset_stats", "stats"]

_lock = threading.Lock()
_stats = [0, 0, 0]  # chunks, bytes_to_device, bytes_to_host


class Chunk(NamedTuple):
    """Flat views of one chunk: the param's and grad's elements, the states staged on device."""

    param: Tensor
    grad: Tensor
    states: list[Tensor]


def stats() -> list[int]:
    """``[chunks, bytes_to_device, bytes_to_host]`` streamed by the generic kernels."""
    with _lock:
        return list(_stats)


def reset_stats() -> None:
    """Zeroes the generic kernels' streaming counters."""
    with _lock:
        _stats[:] = [0, 0, 0]


def _count(nbytes: int, write_back: bool) -> None:
    with _lock:
        _stats[0] += 1
        _stats[1] += nbytes
        if write_back:
            _stats[2] += nbytes


def _stage(host: Tensor, param: Tensor, streamed: bool) -> Tensor:
    if host.device == param.device and not streamed:
        return host
    return host.to(param.device, copy=True, non_blocking=host.is_pinned())


def chunks(
    param: Tensor, grad: Tensor, states: list[Tensor], chunk_elements: int, write_back: bool
) -> Iterator[Chunk]:
    """Yields the chunks of one parameter; after each, writes its staged states back.

    Args:
        param: contiguous parameter (updated in place through ``Chunk.param``).
        grad: its gradient, same number of elements, on the parameter's device.
        states: contiguous state tensors, on the parameter's device or in host memory.
        chunk_elements: elements per streamed chunk; 0 keeps the state where it is.
        write_back: copy staged states back to their home (False for read-only passes).

    Yields:
        One :class:`Chunk` per chunk; the consumer updates its tensors in place.
    """
    n = param.numel()
    streamed = chunk_elements > 0 and bool(states)
    step = chunk_elements if streamed else max(n, 1)
    flat_p, flat_g = param.view(-1), grad.reshape(-1)
    flat_s = [s.view(-1) for s in states]
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        homes = [s[lo:hi] for s in flat_s]
        staged = [_stage(h, param, streamed) for h in homes]
        yield Chunk(flat_p[lo:hi], flat_g[lo:hi], staged)
        if write_back:
            for home, st in zip(homes, staged):
                if st is not home:
                    home.copy_(st)
        if streamed:
            _count(sum(h.numel() * h.element_size() for h in homes), write_back)
