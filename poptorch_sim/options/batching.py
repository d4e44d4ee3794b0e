"""The batching setters of ``poptorch.Options``: device iterations, replicas, which outputs a
call returns."""

from __future__ import annotations

from typing import Self

from ..enums import CommGroupType, OutputMode
from ..logger import logger
from ._dict import OptionsDict

__all__ = ["BatchingSetters"]


class BatchingSetters(OptionsDict):
    """``Options``' setters of how a call's batch is split and what it returns (part of
    ``poptorch.Options``; its options are declared there)."""

    def deviceIterations(self, device_iterations: int) -> Self:
        """Number of steps (optimizer steps in training) the device runs per model call."""
        _check_positive("device_iterations", device_iterations)
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Self:
        """Number of data-parallel replicas of the model."""
        _check_positive("replication_factor", replication_factor)
        self.set(replication_factor=replication_factor)
        return self

    def inputReplicaGrouping(self, input_group_size: int, input_group_type: CommGroupType) -> Self:
        """Replicas in a group of ``input_group_size`` receive the same slice of the input."""
        if input_group_type == CommGroupType.NoGrouping:
            input_group_size, input_group_type = 1, CommGroupType.Consecutive
        if input_group_type == CommGroupType.All:
            raise ValueError(
                "CommGroupType.All is not supported for input replica grouping: use "
                "CommGroupType.Consecutive or CommGroupType.Orthogonal"
            )
        r = self.replication_factor
        if input_group_size > r or r % input_group_size != 0:
            raise ValueError(
                f"input_group_size ({input_group_size}) must divide the replication factor "
                f"({r}): set Options.replicationFactor first"
            )
        self.set(input_group_size=input_group_size, input_cgt=input_group_type)
        return self

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Self:
        """``False`` gives each replica its own copy of the model's buffers."""
        self.set(broadcast_buffers=broadcast_buffers)
        return self

    def outputMode(self, output_mode: OutputMode, output_return_period: int | None = None) -> Self:
        """Which micro-batches' outputs a call returns: All, EveryN(period), Final, Sum, Default."""
        if not isinstance(output_mode, OutputMode):
            raise AssertionError(f"output_mode must be a poptorch.OutputMode, got {output_mode!r}")
        if output_mode == OutputMode.EveryN:
            if output_return_period is None or output_return_period <= 0:
                raise AssertionError(
                    "EveryN output mode must define an output return period greater than zero"
                )
        elif output_return_period is not None:
            logger.info("output_return_period is only used with OutputMode.EveryN: value ignored")
        period = output_return_period if output_mode == OutputMode.EveryN else 1
        self.set(output_mode=int(output_mode), output_return_period=period)
        return self

    def anchorMode(self, anchor_mode: OutputMode, anchor_return_period: int | None = None) -> Self:
        """PopTorch 2.0's name for ``outputMode``."""
        return self.outputMode(anchor_mode, anchor_return_period)

    def defaultOutputMode(self) -> bool:
        """Whether the output mode is still ``Default`` (resolved when the model is wrapped)."""
        return self.output_mode == OutputMode.Default

    defaultAnchorMode = defaultOutputMode

    def anchorTensor(
        self,
        short_name: str,
        long_name: str,
        output_mode: OutputMode | None = None,
        output_return_period: int = 1,
    ) -> None:
        """Return tensor ``long_name`` (``Gradient___<param>``, ``UpdatedVar___<param>``, or a
        weight or buffer of the model by its name, e.g. ``running_mean``).

        Read it after each call with ``model.getAnchoredTensor(short_name)``: the values of the
        call's device iterations joined per ``output_mode`` (default: the model's output mode)
        as outputs are, e.g. under ``OutputMode.All`` a bias of 10 with 3 device iterations
        gives shape ``(30,)``. Simulated: one value per optimizer step; an IPU's All/EveryN
        buffer also has a row per accumulation step and replica. See [Note: anchored tensors
        follow their output mode] in ``executor/anchors.py``.

        Args:
            short_name: the name to read it by.
            long_name: PopART's name of the tensor.
            output_mode: which device iterations' values are returned (None: the model's).
            output_return_period: the period of ``OutputMode.EveryN``.
        """
        if not isinstance(short_name, str) or not isinstance(long_name, str):
            raise AssertionError("anchorTensor expects the short and long names as strings")
        self.checkIsFrozen()
        mode = None if output_mode is None else int(output_mode)
        self.anchored_tensors[short_name] = (
            long_name,
            mode is None,
            mode or 0,
            output_return_period,
        )


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AssertionError(f"{name} must be a positive integer, got {value!r}")
