"""``poptorch.Options``: how a model is run (batching, replicas, strategy, precision, ...)."""

from __future__ import annotations

import os

import torch

from .. import env
from ..enums import CommGroupType, ConnectionType, OutputMode, SyncPattern
from ..logger import logger
from ._dict import OptionsDict, no_effect
from .config import ConfigFileError, apply_config_file, apply_mapping, parse_json
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


class Options(OptionsDict):
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

    # -- batching -------------------------------------------------------------------------------
    def deviceIterations(self, device_iterations: int) -> Options:
        """Number of steps (optimizer steps in training) the device runs per model call."""
        _check_positive("device_iterations", device_iterations)
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Options:
        """Number of data-parallel replicas of the model."""
        _check_positive("replication_factor", replication_factor)
        self.set(replication_factor=replication_factor)
        return self

    def inputReplicaGrouping(
        self, input_group_size: int, input_group_type: CommGroupType
    ) -> Options:
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

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Options:
        """``False`` gives each replica its own copy of the model's buffers."""
        self.set(broadcast_buffers=broadcast_buffers)
        return self

    def outputMode(
        self, output_mode: OutputMode, output_return_period: int | None = None
    ) -> Options:
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

    def anchorMode(
        self, anchor_mode: OutputMode, anchor_return_period: int | None = None
    ) -> Options:
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
        """Return tensor ``long_name`` (``Gradient___<param>``, ``UpdatedVar___<param>``).

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

    # -- device ---------------------------------------------------------------------------------
    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:
        """Round the number of IPUs reserved up to a power of two."""
        self.set(auto_round_num_ipus=auto_round_num_ipus)
        return self

    def useIpuModel(self, use_model: bool) -> Options:
        """Run on the IPU Model (stored; every IPU is simulated here)."""
        no_effect("useIpuModel")
        self.createOrSet(use_model=use_model)
        return self

    def useIpuId(self, ipu_id: int) -> Options:
        """Use the device with this id."""
        if not isinstance(ipu_id, int) or ipu_id < 0:
            raise AssertionError(f"ipu_id must be a non-negative integer, got {ipu_id!r}")
        self.createOrSet(ipu_id=ipu_id)
        return self

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Options:
        """Compile for an IPU of ``ipu_version`` without attaching to one."""
        self.connectionType(ConnectionType.Never)
        self.createOrSet(ipu_version=ipu_version)
        return self

    def connectionType(self, connection_type: ConnectionType) -> Options:
        """When to attach: Always, OnDemand or Never (offline compilation)."""
        if not isinstance(connection_type, ConnectionType):
            raise AssertionError(
                f"connection_type must be a poptorch.ConnectionType, got {connection_type!r}"
            )
        self.set(connection_type=int(connection_type))
        return self

    def syncPattern(self, sync_pattern: SyncPattern) -> Options:
        """Host synchronisation pattern (stored)."""
        if not isinstance(sync_pattern, SyncPattern):
            raise AssertionError(
                f"sync_pattern must be a poptorch.SyncPattern, got {sync_pattern!r}"
            )
        no_effect("syncPattern")
        self.set(sync_pattern=int(sync_pattern))
        return self

    def setExecutionStrategy(self, strategy: _IExecutionStrategy) -> Options:
        """Pipelined (default), Sharded, SerialPhased or ParallelPhased execution."""
        if not isinstance(strategy, _IExecutionStrategy):
            raise AssertionError(
                f"strategy must be an execution strategy (PipelinedExecution, "
                f"ShardedExecution, ...), got {type(strategy).__name__}"
            )
        self._execution_strategy = strategy
        return self

    def setManualShardingConfig(self, config: str | os.PathLike[str] | list[dict]) -> Options:
        """Cut the model at named nodes, PopRT's way (instead of by blocks).

        Simulated (PopRT, not PopTorch): the same as ``poprt --manual_sharding_config``. The
        config is PopRT's list of ``{node, device, stage}`` (a YAML file read with PyYAML, or
        the list itself); see ``poptorch_sim.Sharder`` for the rule and
        ``poptorch_sim.list_nodes`` for the node names. Node names are checked when the model
        compiles.

        Args:
            config: path of the YAML file, or the list of entries.

        Raises:
            poptorch_sim.compiler.sharding.ShardingError: unreadable file, not PopRT's format,
                or a node listed twice.

        >>> opts = Options().setManualShardingConfig([{"node": "add", "device": 0, "stage": 0}])
        """
        from ..compiler.sharding.config import ShardingConfig, load_sharding_config

        if isinstance(config, list):
            parsed = ShardingConfig.from_entries(config, "Options.setManualShardingConfig")
        else:
            parsed = load_sharding_config(config)
        self.createOrSet(manual_sharding=(parsed.to_entries(), parsed.source))
        return self

    def setAvailableMemoryProportion(
        self, available_memory_proportion: dict[str, float]
    ) -> Options:
        """Proportion of tile memory for temporaries, per IPU: ``{"IPU0": 0.5}``.

        Raises:
            AssertionError: not a dict of ``"IPU<n>"`` keys (PopTorch's type).
            ValueError: ``<n>`` is not an index, or a value is not in (0, 1].
        """
        if not isinstance(available_memory_proportion, dict) or not all(
            isinstance(k, str) and k.startswith("IPU") for k in available_memory_proportion
        ):
            raise AssertionError(
                "Available memory proportions are expected to be in a dictionary of "
                '{"IPU0": 0.5} where the 0 in IPU0 is the index of the IPU. Invalid key: '
                f"{available_memory_proportion!r}"
            )
        for key, value in available_memory_proportion.items():
            if not key[3:].isdigit():  # PopTorch's int(key[3:]) raises ValueError too
                raise ValueError(
                    f"Invalid key: {key!r}: expected 'IPU' followed by the index of an IPU, "
                    'e.g. {"IPU0": 0.5}'
                )
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not 0.0 < value <= 1.0:
                raise ValueError(
                    f"The available memory proportion of {key} must be a number in (0, 1], got "
                    f"{value!r}: it is the proportion of tile memory ops may use for temporary "
                    "data"
                )
        no_effect("setAvailableMemoryProportion")
        self.createOrSet(available_memory_proportion=dict(available_memory_proportion))
        return self

    # -- compilation and profiling --------------------------------------------------------------
    def enableExecutableCaching(self, path: str | None) -> Options:
        """Cache compiled executables in ``path`` (``None`` disables); compiling is instant here."""
        no_effect("enableExecutableCaching")
        if path is None:
            self._popart.set("enableEngineCaching", False)
        else:
            self._popart.set("enableEngineCaching", True)
            self._popart.set("cachePath", path)
        return self

    def enableSyntheticData(self, enabled: bool) -> Options:
        """Run on data generated on the device instead of the host's (benchmarking perfect IO).

        As in PopTorch, any true value selects ``popart.SyntheticDataMode.RandomNormal`` (2);
        ``opts._Popart.set("syntheticDataMode", mode)`` picks another mode (1 ``Zeros``,
        3 ``RandomUniform``).

        Simulated: each call's input tensors are replaced by tensors of their shape and dtype
        (floating point: zeros, N(0, 1) or U(0, 1); integer and bool: zeros, so labels stay
        valid); outputs are returned as computed, where an IPU would not copy them back.
        See ``poptorch_sim.executor.synthetic``.

        Args:
            enabled: True (or a non-zero ``SyntheticDataMode``) for RandomNormal, False for
                the host's data.

        >>> opts = Options().enableSyntheticData(True)
        """
        self._popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    def enableStableNorm(self, enabled: bool) -> Options:
        """Numerically stable norm statistics (stored; PyTorch's norms are already stable)."""
        self._popart.set("enableStableNorm", enabled)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> Options:
        """Log the device cycle count (only real hardware counts cycles)."""
        self._popart.set("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def enableProfiling(self, profile_dir: str | None = None) -> Options:
        """Write an execution trace (Chrome trace JSON, opens in Perfetto) and the memory report
        to ``profile_dir``; as PopTorch, also sets ``debug.allowOutOfMemory``."""
        self._profile_dir = profile_dir or "."
        self._popart.set(
            "engineOptions",
            {
                "autoReport.all": "true",
                "autoReport.directory": self._profile_dir,
                "debug.allowOutOfMemory": "true",  # as PopTorch: profile what does not fit
            },
        )
        return self

    def modelName(self, name: str) -> Options:
        """Name of the model (used in reports)."""
        self.createOrSet(model_name=name)
        return self

    def logDir(self, log_dir: str) -> Options:
        """Where logs and reports go."""
        self.set(log_dir=log_dir)
        return self

    def maxRepeatLogs(self, max_lines: int | None) -> Options:
        """How many times one log message may repeat (``None``: unlimited)."""
        self.set(max_repeat_logs=(1 << 63) - 1 if max_lines is None else max_lines)
        return self

    def disableModuleNamescope(self) -> Options:
        """Name ops without their module scope (stored)."""
        self._module_namescope_enabled = False
        return self

    def updatableNamedBuffers(self, buffers: list[str]) -> Options:
        """Buffers that ``copyNamedBuffersToDevice()`` uploads."""
        self._popart.set("updatableNamedBuffers", list(buffers))
        return self

    def showCompilationProgressBar(self, show: bool = True) -> Options:
        """Show the "Graph compilation" progress bar (needed for ``compilationTime()``)."""
        self._show_compilation_progress_bar = show
        return self

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> Options:
        """Report unexpected optimizer attributes at debug level instead of as warnings."""
        self._relax_optimizer_attributes_checks = relax
        return self

    def sourceLocationExcludes(self, excludes: list[str]) -> Options:
        """Paths ignored when attributing ops to source lines."""
        self._source_location_excludes = list(excludes)
        return self

    def appendToLocationExcludes(self, *excludes: str) -> Options:
        """Add paths ignored when attributing ops to source lines."""
        self._source_location_excludes.extend(excludes)
        return self

    def randomSeed(self, random_seed: int) -> Options:
        """Seed the device RNG; also seeds torch now, as PopTorch does."""
        if not isinstance(random_seed, int):
            raise AssertionError(f"random_seed must be an int, got {random_seed!r}")
        torch.manual_seed(random_seed)
        self.createOrSet(random_seed=random_seed)
        return self

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
    def profile_dir(self) -> str | None:
        """Where the execution trace goes: ``enableProfiling`` or ``POPLAR_ENGINE_OPTIONS``."""
        if self._profile_dir is not None:
            return self._profile_dir
        engine = env.engine_options()
        return engine.get("autoReport.directory") if engine else None

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


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AssertionError(f"{name} must be a positive integer, got {value!r}")
