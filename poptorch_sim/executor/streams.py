"""A call's data streams: host batch → micro-batch views, micro-batch outputs → one output.

The arithmetic of the input side with replica grouping is ``layout.Layout``; this module is the
plain ``[DI, GA, R]`` split and the output side, which ``outputs.OutputCollector`` uses.

[Note: micro-batch layout]
A host batch of ``b = DI * GA * R * mb`` rows is read as ``[DI, GA, R, mb, ...]`` (PopART's
``[batches_per_step, accl_factor, repl_factor, micro_batch_size, ...]``):

    row block   0     1    ...  R-1  |  R   ...  2R-1 | ... | (DI*GA-1)*R ... DI*GA*R-1
    (d, a, r)  (0,0,0)(0,0,1)  (0,0,R-1)|(0,1,0)  (0,1,R-1)| ... | (DI-1,GA-1,0) ... (DI-1,GA-1,R-1)

so micro-batch ``(d, a, r)`` is rows ``[((d*GA + a)*R + r)*mb : +mb]``. Outputs per OutputMode
(``b_dim`` multiplies dim 0, or becomes dim 0 of a 0-d output; ``b_dim == 1`` keeps the
traced shape):

    mode         b_dim          content, in [DI, GA, R] order
    All          DI*GA*R        every micro-batch
    EveryN(P)    DI*GA*R / P    micro-batches of device iterations P-1, 2P-1, ...
    Final        R              the last device iteration's last accumulation step, per replica
    Sum          R              per replica, the elementwise sum over its DI*GA micro-batches
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..kernels import generic

_ops = torch.ops.poptorch_sim  # stream_sum: C++ on the CPU, generic on CUDA (``kernels``)

__all__ = ["assemble", "micro_batches", "output_batch_dim"]

_MODES = ("all", "everyn", "final", "sum")


@torch.library.register_fake("poptorch_sim::stream_sum")
def _stream_sum_fake(micro_batches: list[Tensor], replicas: int) -> Tensor:
    return micro_batches[0].new_empty((replicas, *micro_batches[0].shape))


def micro_batches(host: Tensor, di: int, ga: int, r: int) -> list[Tensor]:
    """Splits a host batch into its ``DI*GA*R`` micro-batches, as views (no copies).

    Args:
        host: the host tensor; dim 0 must be a multiple of ``di * ga * r``. A 0-d tensor is
            one micro-batch when ``di * ga * r == 1``.
        di: device iterations. ga: gradient accumulation steps. r: replicas (input groups).

    Returns:
        ``DI*GA*R`` views in ``[DI, GA, R]`` order: micro-batch ``(d, a, r)`` is element
        ``(d*GA + a)*R + r``. See [Note: micro-batch layout].

    Raises:
        AssertionError: the batch dimension is not a multiple (PopTorch's message).

    >>> [t.tolist() for t in micro_batches(torch.arange(4), 2, 1, 2)]
    [[0], [1], [2], [3]]
    """
    n = di * ga * r
    b = host.shape[0] if host.dim() > 0 else 1
    if b % n != 0 or (host.dim() == 0 and n > 1):
        raise AssertionError(
            f"Invalid batch dimension: In the input {tuple(host.shape)}, the batch dimension "
            f"({b}) must be a multiple of Options.deviceIterations({di}) * "
            f"(Options.replicationFactor({r}) / "
            f"Options.inputReplicaGrouping.input_group_size(1)) * "
            f"Options.Training.gradientAccumulation({ga}) = {n} because it is used to "
            "calculate the batch size which will be executed on the device in any given "
            "iteration. For a full explanation see the batching semantics page of the "
            "documentation."
        )
    if host.dim() == 0:
        return [host]
    return list(host.split(b // n))


def output_batch_dim(mode: str, period: int, di: int, ga: int, r: int) -> int:
    """``b_dim`` of an output for ``mode`` (``"all"``, ``"everyn"``, ``"final"``, ``"sum"``).

    Raises:
        ValueError: unknown mode, or an EveryN period that is not a factor of ``di``.
    """
    mode = _check_mode(mode, period, di)
    if mode == "all":
        return di * ga * r
    if mode == "everyn":
        return di * ga * r // period
    return r


def assemble(
    outputs: list[Tensor],
    mode: str,
    period: int,
    di: int,
    ga: int,
    r: int,
    empty: Callable[[tuple[int, ...], torch.dtype], Tensor] | None = None,
) -> Tensor:
    """Builds one call's output from the per-micro-batch outputs, with at most one copy.

    Args:
        outputs: ``DI*GA*R`` tensors of the traced shape ``S``, in ``[DI, GA, R]`` order.
        mode: ``"all"``, ``"everyn"``, ``"final"`` or ``"sum"`` (OutputMode names, any case).
        period: the EveryN return period (ignored by other modes).
        di, ga, r: device iterations, accumulation steps, replicas.
        empty: where a joined CPU output goes (``empty(shape, dtype)``, e.g.
            ``OutputBuffers.empty``); default ``torch.cat``'s own new tensor.

    Returns:
        ``S`` with dim 0 multiplied by ``b_dim``; a 0-d ``S`` becomes ``[b_dim]``; exactly ``S``
        when ``b_dim == 1`` (then the micro-batch tensor itself is returned for All/EveryN/
        Final, uncopied).

    Raises:
        ValueError: wrong number of outputs, unknown mode or bad period.

    >>> assemble([torch.tensor(1.0), torch.tensor(2.0)], "sum", 1, 2, 1, 1)
    tensor(3.)
    """
    mode = _check_mode(mode, period, di)
    if len(outputs) != di * ga * r:
        raise ValueError(
            f"assemble needs DI*GA*R = {di}*{ga}*{r} = {di * ga * r} micro-batch outputs, "
            f"got {len(outputs)}"
        )
    per_step = ga * r
    if mode == "sum":
        if outputs[0].device.type in ("cpu", "cuda"):
            summed = _ops.stream_sum(outputs, r)  # C++ on the CPU, generic on CUDA
        else:
            summed = generic.stream_sum(outputs, r)
        return _join_rows(summed, outputs[0].dim(), r)
    if mode == "all":
        picked = outputs
    elif mode == "everyn":
        picked = [t for d in range(period - 1, di, period)
                  for t in outputs[d * per_step:(d + 1) * per_step]]  # fmt: skip
    else:
        picked = outputs[-r:]
    if len(picked) == 1:
        return picked[0]
    if outputs[0].dim() == 0:
        return torch.stack(picked)
    if empty is None or not _plain_rows(picked):
        return torch.cat(picked)
    first = picked[0]
    joined = empty((sum(t.shape[0] for t in picked), *first.shape[1:]), first.dtype)
    return torch.cat(picked, out=joined)


def _plain_rows(parts: list[Tensor]) -> bool:
    """Whether ``torch.cat(parts)`` would be a contiguous CPU tensor of the parts' dtype that
    autograd does not record (so ``cat(parts, out=)`` into an empty one is the same)."""
    first = parts[0]
    return all(
        t.device.type == "cpu"
        and t.dtype == first.dtype
        and t.is_contiguous()
        and not t.requires_grad
        and t.shape[1:] == first.shape[1:]
        for t in parts
    )


def _join_rows(stacked: Tensor, traced_dim: int, b_dim: int) -> Tensor:
    """``[b_dim, *S]`` → the output shape rule (a view, no copy)."""
    if b_dim == 1:
        return stacked[0]
    if traced_dim == 0:
        return stacked
    return stacked.flatten(0, 1)


def _check_mode(mode: str, period: int, di: int) -> str:
    key = mode.lower()
    if key not in _MODES:
        raise ValueError(f"unknown output mode {mode!r} (known: All, EveryN, Final, Sum)")
    if key == "everyn":
        if period < 1 or period > di:
            raise ValueError(
                f"Return period must be <= to the number of batches per step: period {period}, "
                f"deviceIterations {di}"
            )
        if di % period != 0:
            raise ValueError(
                f"Return period must be a factor of the number of batches per step: period "
                f"{period}, deviceIterations {di}"
            )
    return key
