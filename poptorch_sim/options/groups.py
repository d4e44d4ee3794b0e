"""The option groups of ``Options``: Training, Precision, TensorLocations, Distributed, Jit, _Popart."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..enums import MeanReductionStrategy, ReductionType
from ..logger import logger
from ._dict import OptionsDict, no_effect
from .locations import TensorLocationSettings

__all__ = [
    "_DistributedOptions",
    "_JitOptions",
    "_PopartOptions",
    "_PrecisionOptions",
    "_TensorLocationOptions",
    "_TrainingOptions",
]


class _PopartOptions(OptionsDict):
    """Free-form PopART session options (``opts._Popart.set("key", value)``).

    Simulated: any key is accepted and stored; none changes what runs.
    """

    def __init__(self) -> None:
        super().__init__()
        self._values["options"] = {
            "instrumentWithHardwareCycleCounter": False,
            "rearrangeAnchorsOnHost": False,
        }

    @property
    def options(self) -> dict[str, Any]:
        """The PopART options set so far."""
        return self._values["options"]

    def set(self, key: str, value: Any) -> _PopartOptions:  # type: ignore[override]
        """Set PopART option ``key`` to ``value``."""
        self.checkIsFrozen()
        if not isinstance(key, str):
            raise AssertionError(f"PopART option names must be strings, got {key!r}")
        self.options[key] = value
        no_effect(f"_Popart.set({key!r})")
        return self

    def setEngineOptions(self, engine_options: dict[str, str]) -> _PopartOptions:
        """Set Poplar engine options (``engineOptions``)."""
        if not isinstance(engine_options, dict):
            raise AssertionError(f"engine_options must be a dict, got {type(engine_options)}")
        return self.set("engineOptions", engine_options)

    def setPatterns(self, patterns: dict[str, bool], level: int = 2) -> _PopartOptions:
        """Enable or disable PopART graph patterns."""
        if not isinstance(patterns, dict):
            raise AssertionError(f"patterns must be a dict of name -> bool, got {type(patterns)}")
        self.set("patterns_level", level)
        return self.set("patterns", patterns)

    def toDict(self) -> dict[str, Any]:
        return dict(self.options)

    def __repr__(self) -> str:
        return f"_PopartOptions({self.options!r})"


class _JitOptions(OptionsDict):
    """How ``forward`` is captured (and PopTorch's legacy tracing switch)."""

    def __init__(self) -> None:
        super().__init__(capture_method="auto")

    def captureMethod(self, method: str) -> _JitOptions:
        """Choose how ``forward`` is captured into a graph to split at its blocks.

        Beyond PopTorch (which captures through its dispatcher): "auto" (the default) tries
        torch.fx symbolic tracing, then ``torch.export`` (non-strict) when fx fails (models
        with Python decisions on shapes, Hugging Face models); "fx" and "export" use only one.

        Args:
            method: "auto", "fx" or "export".

        Raises:
            ValueError: an unknown method.

        >>> opts = poptorch.Options()
        >>> opts.Jit.captureMethod("export")
        """
        if method not in ("auto", "fx", "export"):
            raise ValueError(f"Unknown capture method {method!r}: use 'auto', 'fx' or 'export'")
        self.set(capture_method=method)
        return self

    def traceModel(self, trace_model: bool) -> _JitOptions:
        """Deprecated: tracing with ``torch.jit`` is gone; ``True`` is an error."""
        logger.warning(
            "[Deprecated] options.Jit.traceModel() does nothing: False is the default and "
            "True is no longer supported"
        )
        if trace_model:
            raise ValueError("options.Jit.traceModel(True) is no longer supported")
        return self


class _PrecisionOptions(OptionsDict):
    """Numerical precision options; they are forwarded to the PopART options."""

    def __init__(self, popart: _PopartOptions) -> None:
        super().__init__()
        self._popart = popart

    def halfFloatCasting(self, half_float_casting: Any) -> _PrecisionOptions:
        """Deprecated no-op: half inputs are promoted as in PyTorch."""
        logger.warning(
            "[Deprecated] options.Precision.halfFloatCasting() does nothing: "
            "HalfUpcastToFloat is the only behaviour and matches PyTorch"
        )
        return self

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:
        """Deprecated no-op."""
        if not isinstance(value, bool):
            raise ValueError("runningStatisticsAlwaysFloat needs to be set to a bool")
        logger.warning(
            "[Deprecated] options.Precision.runningStatisticsAlwaysFloat() does nothing: "
            "False is the only behaviour and matches PyTorch"
        )
        return self

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:
        """Stop a run at the first invalid, dividing-by-zero or overflowing float op (see
        ``executor/fp_checks.py``)."""
        if not isinstance(enabled, bool):
            raise AssertionError("enableFloatingPointExceptions needs to be set to a bool")
        self._popart.set("enableFloatingPointChecks", enabled)
        return self

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        """Stochastic rounding of fp16 results (stored; no effect in simulation)."""
        if not isinstance(enabled, bool):
            raise AssertionError("enableStochasticRounding needs to be set to a bool")
        self._popart.set("enableStochasticRounding", enabled)
        return self

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:
        """Data type of matmul and convolution partials: ``torch.float`` or ``torch.half``."""
        if dtype == torch.float32:
            name = "float"
        elif dtype == torch.float16:
            name = "half"
        else:
            raise ValueError(
                f"parameter to setPartialsType should be either torch.float or torch.half, "
                f"got {dtype}"
            )
        self._popart.set("partialsTypeMatMuls", name)
        self._popart.set("convolutionOptions", {"partialsType": name})
        return self


class _TrainingOptions(OptionsDict):
    """Options for training models only (``opts.Training``)."""

    def __init__(self, popart: _PopartOptions) -> None:
        super().__init__(
            gradient_accumulation=1,
            accumulation_and_replication_reduction_type=ReductionType.Mean,
            meanAccumulationAndReplicationReductionStrategy=MeanReductionStrategy.Post,
        )
        self._popart = popart

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        """Number of micro-batches whose gradients are accumulated before each weight update."""
        _check_positive_int("gradient_accumulation", gradient_accumulation)
        self.set(gradient_accumulation=gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(
        self, reduction_type: ReductionType
    ) -> _TrainingOptions:
        """Reduce gradients across accumulation steps and replicas by Mean (default) or Sum."""
        if reduction_type not in (ReductionType.Mean, ReductionType.Sum) or not isinstance(
            reduction_type, ReductionType
        ):
            raise ValueError(
                "accumulationAndReplicationReductionType must be set to "
                "poptorch.ReductionType.Mean or poptorch.ReductionType.Sum"
            )
        self.set(accumulation_and_replication_reduction_type=reduction_type)
        return self

    # PopTorch 2.0's name.
    accumulationReductionType = accumulationAndReplicationReductionType

    def setMeanAccumulationAndReplicationReductionStrategy(
        self, mean_reduction_strategy: MeanReductionStrategy
    ) -> _TrainingOptions:
        """Where a Mean reduction divides: Running or Post (numerics only)."""
        if not isinstance(mean_reduction_strategy, MeanReductionStrategy):
            raise ValueError(
                "setMeanAccumulationAndReplicationReductionStrategy expects a "
                f"poptorch.MeanReductionStrategy, got {mean_reduction_strategy!r}"
            )
        self.set(meanAccumulationAndReplicationReductionStrategy=mean_reduction_strategy)
        return self

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        """Automatic loss scaling (stored; no effect in simulation)."""
        if not isinstance(enabled, bool):
            raise AssertionError("setAutomaticLossScaling needs to be set to a bool")
        self._popart.set("automaticLossScalingSettings.enabled", enabled)
        return self

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:
        """Convolution dithering (stored; no effect in simulation)."""
        if not isinstance(enabled, bool):
            raise AssertionError("setConvolutionDithering needs to be set to a bool")
        self._popart.set("convolutionOptions", {"enableConvDithering": enabled})
        return self


class _DistributedOptions(OptionsDict):
    """Multi-process options (``opts.Distributed``), read from the environment by default."""

    def __init__(self) -> None:
        super().__init__(num_distributed_processes=1, distributed_process_id=0)
        self._var_num_processes = "OMPI_COMM_WORLD_SIZE"
        self._var_process_id = "OMPI_COMM_WORLD_RANK"
        self.setEnvVarNames(self._var_num_processes, self._var_process_id)

    def disable(self) -> _DistributedOptions:
        """Run as a single process."""
        self.set(num_distributed_processes=1, distributed_process_id=0)
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> _DistributedOptions:
        """Read the process count and id from these environment variables."""
        self._var_num_processes = var_num_processes
        self._var_process_id = var_process_id
        num = os.environ.get(var_num_processes, "1")
        pid = os.environ.get(var_process_id, "0")
        return self.configureProcessId(int(pid), int(num))

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:
        """Set this process's id and the number of processes."""
        if not 0 <= process_id < num_processes:
            raise AssertionError(
                f"process_id ({process_id}) must be in [0, num_processes ({num_processes}))"
            )
        self.set(distributed_process_id=process_id, num_distributed_processes=num_processes)
        return self

    @property
    def processId(self) -> int:
        """Id of this process."""
        return self.distributed_process_id

    @property
    def numProcesses(self) -> int:
        """Number of processes."""
        return self.num_distributed_processes


class _TensorLocationOptions(OptionsDict):
    """Where activations, weights, optimizer state and accumulators live (``opts.TensorLocations``)."""

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:
        """Number of IO tiles (an even number between 32 and 192)."""
        if not isinstance(num_tiles, int) or not (32 <= num_tiles <= 192 and num_tiles % 2 == 0):
            raise AssertionError("numIOTiles must be an even number between 32 and 192.")
        self.createOrSet(numIOTiles=num_tiles)
        return self

    def _set_location(self, key: str, location: TensorLocationSettings) -> _TensorLocationOptions:
        if not isinstance(location, TensorLocationSettings):
            raise AssertionError(
                f"location must be a poptorch.TensorLocationSettings, got {type(location)}"
            )
        self.createOrSet(**{key: location.toDict()})
        return self

    def setActivationLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Storage of activations."""
        no_effect("TensorLocations.setActivationLocation")
        return self._set_location("location_activation", location)

    def setWeightLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Storage of weights."""
        no_effect("TensorLocations.setWeightLocation")
        return self._set_location("location_weight", location)

    def setOptimizerLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Storage of optimizer state; off chip, the state is streamed in chunks for each update."""
        return self._set_location("location_optimizer", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Storage of gradient accumulators."""
        no_effect("TensorLocations.setAccumulatorLocation")
        return self._set_location("location_accumulator", location)

    @property
    def optimizer_off_chip(self) -> bool:
        """Whether the optimizer state is kept off chip."""
        return self.exists("location_optimizer") and not self.location_optimizer.get("onChip", 1)


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AssertionError(f"{name} must be a positive integer, got {value!r}")
