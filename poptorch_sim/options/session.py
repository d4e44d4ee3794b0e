"""The options PopTorch hands its compiler: their names by kind, validation, and the debug lines.

PopTorch passes ``Options.toDict()`` to its C++ session options, which know each option's kind
(bool, uint64, floating point, string, map or list). A name it does not know is refused with
``Unknown <kind> option <name>``, a value of no known kind with ``Unknown value type <type> for
option <name>``; each option accepted is logged at debug level as ``poptorch.Options set <name>
to value <value>`` (maps: ``poptorch.Options set <name>[<key>] to <value>``; lists:
``poptorch.Options added <value> to <name>``). The names below are PopTorch's and PopART's.

Simulated: ``_validateOptions`` refuses unknown names as PopTorch does, but compiling a model
does not (an option poptorch_sim has never heard of is stored and has no effect).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from ..errors import Error
from ..logger import logger

__all__ = ["KINDS", "log_options", "validate_options"]

_BOOL = """
auto_round_num_ipus use_model serial_phases_execution separate_backward_phase broadcast_buffers
enableExplicitIR enableInplaceAmbiguityChecking enableLoadAndOffloadRNGState
batchSerializationSettings.concatOnVirtualGraphChange
batchSerializationSettings.concatOnExecutionPhaseChange
batchSerializationSettings.concatOnPipelineStageChange strictOpVersions opxAliasChecking
opxModifyChecking dotOpNames exportPoplarComputationGraph exportPoplarVertexGraph
separateCallOpPdfs enableOutlining enableOutliningCopyCostPruning rearrangeAnchorsOnHost
rearrangeStreamsOnHost enablePrefetchDatastreams enableNonStableSoftmax enableReplicatedGraphs
enableGradientAccumulation instrumentWithHardwareCycleCounter enablePipelining
disableGradAccumulationTensorStreams disableOptimizerStateTensorStreams compileEngine
constantWeights enableEngineCaching enableMergeExchange enableFloatingPointChecks
enableStochasticRounding ensureFp32LossScaleTensor explicitRecomputation enableExplicitMainLoops
useHostCopyOps aliasZeroCopy delayVarUpdates enableFullyConnectedPass enableSerializedMatmuls
enableStableNorm decomposeGradSum enableDistributedReplicatedGraphs groupHostSync
automaticLossScalingSettings.enabled enableSupportedDataTypeCasting
groupNormStridedChannelGrouping scheduleNonWeightUpdateGradientConsumersEarly
replicatedCollectivesSettings.prepareScheduleForMergingCollectives
replicatedCollectivesSettings.mergeAllReduceCollectives
"""
_UINT64 = """
device_iterations num_distributed_processes distributed_process_id ipu_version ipu_id
gradient_accumulation output_return_period replication_factor input_group_size input_cgt
execution_mode tensors_liveness output_mode connection_type
accumulateOuterFragmentSettings.schedule max_repeat_logs
accumulation_and_replication_reduction_type sync_pattern random_seed
executionPhaseSettings.phases executionPhaseSettings.stages batchSerializationSettings.factor
firstDotOp finalDotOp numIOTiles mergeVarUpdateMemThreshold looseThresholdAtPeak
accumulationFactor swapLimitScheduler globalReplicationFactor globalReplicaOffset
defaultBufferingDepth defaultPrefetchBufferingDepth compilationProgressTotal
transitiveClosureOptimizationThreshold automaticLossScalingSettings.updatePeriod
autodiffSettings.stitchStrategy batchSerializationSettings.transformContext
batchSerializationSettings.method batchSerializationSettings.batchSchedule autoRecomputation
mergeVarUpdate virtualGraphMode syntheticDataMode subgraphCopyingStrategy
accumulationAndReplicationReductionType meanAccumulationAndReplicationReductionStrategy
automaticLossScalingSettings.gradientTensorTrackingMethod
"""
_DOUBLE = """
outlineSequenceBreakCost outlineThreshold timeLimitScheduler
automaticLossScalingSettings.thresholdUpperCountProportion
automaticLossScalingSettings.binEdgeLocation
"""
_STRING = """
log_dir saveInitializersToFile model_name logDir cachePath partialsTypeMatMuls
customCodeletCompileFlags serializedPoprithmsShiftGraphsDir kahnTieBreaker
"""
_CONTAINER = """
accumulateOuterFragmentSettings.excludedVirtualGraphs dotChecks hardwareInstrumentations
customCodelets engineOptions reportOptions convolutionOptions matmulOptions lstmOptions
gclOptions updatableNamedBuffers
"""

# Option kind -> the names PopTorch's compiler accepts for it.
KINDS: dict[str, frozenset[str]] = {
    "bool": frozenset(_BOOL.split()),
    "uint64": frozenset(_UINT64.split()),
    "floating point": frozenset(_DOUBLE.split()),
    "string": frozenset(_STRING.split()),
    "map": frozenset(_CONTAINER.split()),
    "set / vector": frozenset(_CONTAINER.split()),
}

# Read by PopTorch's Python side or handled on their own, never passed as one option.
_SPECIAL = {"anchored_tensors", "patterns_level", "patterns", "available_memory_proportion"}
# Stored by poptorch_sim's Options under names PopTorch's compiler does not have.
_OWN = {"meanAccumulationAndReplicationReductionStrategy", "_show_compilation_progress_bar"}
_EXECUTION_MODES = {"PipelinedExecution": 0, "ShardedExecution": 1}


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, enum.IntEnum)):
        return "uint64"
    if isinstance(value, float):
        return "floating point"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, (list, tuple, set, frozenset)):
        return "set / vector"
    return None


def _check(name: str, value: Any) -> str | None:
    """The kind of one option, or None for the ones PopTorch handles on their own."""
    if name in _SPECIAL or name.startswith("location_"):
        return None
    kind = _kind(value)
    if kind is None:
        raise Error(f"Unknown value type {type(value).__name__} for option {name}")
    if name not in KINDS[kind] and name not in _OWN:
        raise Error(f"Unknown {kind} option {name}")
    return kind


def validate_options(options: Mapping[str, Any]) -> None:
    """Set every option the way PopTorch's compiler does (``poptorch_core._validateOptions``):
    each one accepted is logged, the first one refused raises.

    Raises:
        poptorch.Error: ``Unknown <kind> option <name>`` or ``Unknown value type <type> for
            option <name>``.

    >>> validate_options(poptorch.Options().toDict())
    """
    _set_all(options, strict=True)


def log_options(options: Mapping[str, Any]) -> None:
    """Log each option PopTorch's compiler would set, with its debug line; names it does not
    know are skipped (poptorch_sim stores them without effect)."""
    _set_all(options, strict=False)


def _as_compiled(options: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(options)
    mode = out.get("execution_mode")
    if isinstance(mode, str):  # poptorch_sim names the strategy; PopTorch passes its number
        out["execution_mode"] = _EXECUTION_MODES.get(mode, 2)
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(int(value.value))
    return str(value)


def _set_all(options: Mapping[str, Any], strict: bool) -> None:
    for name, value in _as_compiled(options).items():
        try:
            kind = _check(name, value)
        except Error:
            if strict:
                raise
            continue
        if kind == "map":
            for key, item in value.items():
                logger.debug("poptorch.Options set %s[%s] to %s", name, key, _text(item))
        elif kind == "set / vector":
            for item in value:
                logger.debug("poptorch.Options added %s to %s", _text(item), name)
        elif kind is not None:
            logger.debug("poptorch.Options set %s to value %s", name, _text(value))
