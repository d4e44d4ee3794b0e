"""The batch layout: how a call's host batch splits into micro-batches (``batch_layout``).

A call's host batch holds ``DI × GA × IG`` micro-batches (``IG = R // G`` input groups), laid out
as PopART reads a session's input stream:

    host rows:  [ DI ][ GA ][ IG ][ mb ]      micro-batch (d, a, g) = rows ((d*GA + a)*IG + g)*mb ...
                  │     │     │     └ micro-batch rows
                  │     │     └ input group: replica r reads group r // G (Consecutive)
                  │     │                                      or r % IG (Orthogonal)
                  │     └ gradient accumulation step
                  └ device iteration

Micro-batches are views of the host tensors, never copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..enums import CommGroupType
from ..errors import Error
from ..options import Options
from .inputs import BoundArgs

__all__ = ["Layout", "batch_layout", "check_batch"]


@dataclass(frozen=True)
class Layout:
    """How one call's host batch splits into micro-batches."""

    device_iterations: int
    gradient_accumulation: int
    replicas: int
    group_size: int = 1
    group_type: CommGroupType = CommGroupType.Consecutive

    @property
    def input_groups(self) -> int:
        """``IG``: how many distinct input slices a step feeds to the replicas."""
        return self.replicas // self.group_size

    @property
    def micro_batches(self) -> int:
        """``N = DI × GA × IG``: micro-batches in one host batch."""
        return self.device_iterations * self.gradient_accumulation * self.input_groups

    def group_of(self, replica: int) -> int:
        """The input group replica ``replica`` reads."""
        if self.group_type == CommGroupType.Orthogonal:
            return replica % self.input_groups
        return replica // self.group_size

    def micro_batch(self, bound: BoundArgs, d: int, a: int, r: int) -> BoundArgs:
        """The inputs of device iteration ``d``, accumulation step ``a``, replica ``r`` (views)."""
        index = (d * self.gradient_accumulation + a) * self.input_groups + self.group_of(r)
        n = self.micro_batches

        def narrow(t: torch.Tensor) -> torch.Tensor:
            if t.dim() == 0:
                return t
            mb = t.shape[0] // n
            return t[index * mb : (index + 1) * mb]

        return bound.map_tensors(narrow)

    def step_micro_batches(self, bound: BoundArgs, d: int) -> list[tuple[int, BoundArgs]]:
        """``(replica, inputs)`` of device iteration ``d``'s micro-batches, in [GA, R] order."""
        return [
            (r, self.micro_batch(bound, d, a, r))
            for a in range(self.gradient_accumulation)
            for r in range(self.replicas)
        ]


def batch_layout(options: Options, training: bool) -> Layout:
    """The layout of a model's host batch under ``options``.

    Args:
        options: the model's options (``deviceIterations``, ``replicationFactor``,
            ``inputReplicaGrouping`` and, when training, ``Training.gradientAccumulation``).
        training: whether the model trains; inference accumulates no gradients (``GA = 1``).

    Returns:
        The ``Layout``; its ``micro_batches`` is how many micro-batches one call's inputs hold.

    >>> opts = poptorch.Options().deviceIterations(4)  # doctest: +SKIP
    >>> batch_layout(opts, training=False).micro_batches  # doctest: +SKIP
    4
    """
    return Layout(
        options.device_iterations,
        options.Training.gradient_accumulation if training else 1,
        options.replication_factor,
        options.input_group_size,
        options.input_cgt,
    )


def check_batch(bound: BoundArgs, layout: Layout) -> None:
    """Raise PopTorch's error unless every input's batch dim divides into micro-batches.

    Raises:
        AssertionError: a batch dimension that is not a multiple of ``N`` (PopTorch's wording).
        Error: a zero-sized input.
    """
    n = layout.micro_batches
    for t in bound.tensors():
        if t.numel() == 0:
            raise Error(f"Zero-sized tensors are unsupported (Got shape {list(t.shape)})")
        batch = t.shape[0] if t.dim() > 0 else 1
        if batch % n != 0:
            raise AssertionError(
                f"Invalid batch dimension: In the input {tuple(t.shape)}, the batch dimension "
                f"({batch}) must be a multiple of Options.deviceIterations("
                f"{layout.device_iterations}) * (Options.replicationFactor({layout.replicas}) / "
                f"Options.inputReplicaGrouping.input_group_size({layout.group_size})) * "
                f"Options.Training.gradientAccumulation({layout.gradient_accumulation}) = {n} "
                "because it is used to calculate the batch size which will be executed on the "
                "device in any given iteration. For a full explanation see the batching "
                "semantics page of the documentation."
            )
