"""``poptorch.Options``: how a model is run; its state, groups and files (the setters by
concept: ``batching.py``, ``device.py``, ``compilation.py``)."""

from __future__ import annotations

from .. import env
from ..enums import CommGroupType, ConnectionType, OutputMode, SyncPattern
from .batching import BatchingSetters
from .compilation import CompilationSetters
from .config import ConfigFileError, apply_config_file, apply_mapping, parse_json
from .device import DeviceSetters
from .groups import (
    _DistributedOptions,
    _JitOptions,
    _PopartOptions,
    _PrecisionOptions,
    _TensorLocationOptions,
    _TrainingOptions,
)
from .locations import TensorLocationSettings
from .strategies import (
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
    _IExecutionStrategy,
)

__all__ = [
    "Options",
    "TensorLocationSettings",
    "ConfigFileError",
    "Stage",
    "Phase",
    "PipelinedExecution",
    "ShardedExecution",
    "SerialPhasedExecution",
    "ParallelPhasedExecution",
    "BlockId",
]

BlockId = str


class Options(BatchingSetters, DeviceSetters, CompilationSetters):
    """Options of a ``trainingModel``, ``inferenceModel`` or ``DataLoader``.

    Setters are chainable; values read back as snake_case attributes
    (``opts.device_iterations``). Passing the object to a model or a loader freezes it.

    >>> opts = Options().deviceIterations(4).replicationFactor(2)
    >>> opts.Training.gradientAccumulation(8)
    >>> opts.device_iterations
    4
    """

    def __init__(self) -> None:
        super().__init__(
            replication_factor=1,
            input_group_size=1,
            input_cgt=CommGroupType.Consecutive,
            broadcast_buffers=True,
            device_iterations=1,
            log_dir=".",
            max_repeat_logs=4,
            auto_round_num_ipus=False,
            anchored_tensors={},
            output_mode=int(OutputMode.Default),
            output_return_period=1,
            connection_type=int(ConnectionType.Always),
            sync_pattern=int(SyncPattern.Full),
            available_memory_proportion={},
        )
        self._popart = _PopartOptions()
        self._training = _TrainingOptions(self._popart)
        self._precision = _PrecisionOptions(self._popart)
        self._distributed = _DistributedOptions()
        self._tensor_locations = _TensorLocationOptions()
        self._jit = _JitOptions()
        self._execution_strategy: _IExecutionStrategy = PipelinedExecution()
        self._show_compilation_progress_bar = True
        self._relax_optimizer_attributes_checks = False
        self._module_namescope_enabled = True
        self._source_location_excludes = ["install/poptorch", "site-packages/torch"]
        self._profile_dir: str | None = None
        cache = env.cache_dir()
        if cache:
            self.enableExecutableCaching(cache)
        default_json = env.default_options_json()
        if default_json:
            self.from_json(default_json)

    # -- groups ---------------------------------------------------------------------------------
    @property
    def Training(self) -> _TrainingOptions:
        """Options for training models."""
        return self._training

    @property
    def Precision(self) -> _PrecisionOptions:
        """Numerical precision options."""
        return self._precision

    @property
    def Distributed(self) -> _DistributedOptions:
        """Multi-process options."""
        return self._distributed

    @property
    def TensorLocations(self) -> _TensorLocationOptions:
        """Where tensors are stored."""
        return self._tensor_locations

    @property
    def Jit(self) -> _JitOptions:
        """Legacy tracing options."""
        return self._jit

    @property
    def _Popart(self) -> _PopartOptions:
        """Free-form PopART options."""
        return self._popart

    # PopTorch 2.0's public name.
    Popart = _Popart

    # -- files and serialisation ----------------------------------------------------------------
    def loadFromFile(self, filepath: str) -> Options:
        """Apply a configuration file (PopTorch's one-setter-per-line format, or YAML)."""
        apply_config_file(self, filepath)
        return self

    def from_json(self, string: str) -> Options:
        """Apply ``{"Dotted.setter": value}`` from a JSON string."""
        apply_mapping(self, parse_json(string))
        return self

    def toDict(self) -> dict:
        """Every option in one dictionary (groups merged), as PopTorch serialises them."""
        out = super().toDict()
        for group in (self._training, self._distributed, self._tensor_locations):
            out = group.update(out)
        out.update(self._popart.options)
        out["execution_mode"] = type(self._execution_strategy).__name__
        return out

    def clone(self) -> Options:
        """An unfrozen deep copy."""
        import copy

        return copy.deepcopy(self)

    @property
    def optimizer_off_chip(self) -> bool:
        """Whether the optimizer state is kept off chip."""
        return self._tensor_locations.optimizer_off_chip

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        groups = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in (
                "Distributed",
                "Jit",
                "Precision",
                "TensorLocations",
                "Training",
                "_Popart",
            )
        )
        return f"Options({values}, {groups})"
