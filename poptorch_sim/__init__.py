"""poptorch_sim: Graphcore PopTorch's API on ordinary CPUs and GPUs.

``import poptorch_sim as poptorch`` (or plain ``import poptorch`` once installed) and run a
PopTorch program unmodified.
"""

from __future__ import annotations

from . import enums, ops, optim, options, profiling, testing
from .compat import _impl, _logging, poptorch_core  # poptorch._impl, ._logging, .poptorch_core
from .compiler.sharding import Sharder, list_nodes
from .data import AsynchronousDataAccessor, DataLoader
from .enums import (
    AnchorMode,
    AutoStage,
    CommGroupType,
    ConnectionType,
    DataLoaderMode,
    HalfFloatCastingBehavior,
    Liveness,
    MatMulSerializationMode,
    MeanReductionStrategy,
    MultiConvPlanType,
    OutputMode,
    OverlapMode,
    ReductionType,
    SharingStrategy,
    SyncPattern,
    VariableRetrievalMode,
)
from .errors import Error, RecoverableError, UnrecoverableError, createPoptorchError
from .executor import (
    PoplarExecutor,
    inferenceModel,
    load,
    registerPostCompileHook,
    registerPreCompileHook,
    trainingModel,
)
from .executor.custom_args import ICustomArgParser, registerCustomArgParser
from .hardware import ipuHardwareIsAvailable, ipuHardwareVersion
from .ipu_context import isRunningOnIpu
from .logger import setLogLevel
from .memory import memory_report
from .ops import (
    CPU,
    Attribute,
    BeginBlock,
    Block,
    BlockFunction,
    LegacyBeginBlockFn,
    MultiConv,
    NameScope,
    cond,
    ctc_beam_search_decoder,
    custom_op,
    dynamic_slice,
    dynamic_update,
    for_loop,
    fps,
    identity_loss,
    ipu_print_tensor,
    nearest,
    nop,
    recomputationCheckpoint,
    register_custom_op,
    removeBlocks,
    serializedMatMul,
    set_available_memory,
    set_overlap_for_input,
    set_overlap_for_output,
)
from .options import (
    BlockId,
    ConfigFileError,
    Options,
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
    TensorLocationSettings,
)
from .printing import module_repr, print  # noqa: A004  (PopTorch exports print)
from .timing import time_report

__version__ = "3.4.0+sim"

__all__ = [
    # errors
    "Error",
    "RecoverableError",
    "UnrecoverableError",
    "createPoptorchError",
    # enums
    "AnchorMode",
    "AutoStage",
    "CommGroupType",
    "ConnectionType",
    "DataLoaderMode",
    "HalfFloatCastingBehavior",
    "Liveness",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConvPlanType",
    "OutputMode",
    "OverlapMode",
    "ReductionType",
    "SharingStrategy",
    "SyncPattern",
    "VariableRetrievalMode",
    # options
    "BlockId",
    "ConfigFileError",
    "Options",
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "SerialPhasedExecution",
    "ShardedExecution",
    "Stage",
    "TensorLocationSettings",
    # models
    "PoplarExecutor",
    "inferenceModel",
    "trainingModel",
    "load",
    "registerPreCompileHook",
    "registerPostCompileHook",
    "ICustomArgParser",
    "registerCustomArgParser",
    # data
    "AsynchronousDataAccessor",
    "DataLoader",
    # ops
    "Attribute",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "CPU",
    "LegacyBeginBlockFn",
    "MultiConv",
    "NameScope",
    "cond",
    "ctc_beam_search_decoder",
    "custom_op",
    "dynamic_slice",
    "dynamic_update",
    "for_loop",
    "fps",
    "identity_loss",
    "ipu_print_tensor",
    "nearest",
    "nop",
    "recomputationCheckpoint",
    "removeBlocks",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
    # environment
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "isRunningOnIpu",
    "setLogLevel",
    "print",
    "module_repr",
    # submodules
    "enums",
    "ops",
    "optim",
    "options",
    "poptorch_core",
    "profiling",
    "testing",
    "__version__",
    # poptorch_sim's own additions
    "register_custom_op",
    "Sharder",
    "list_nodes",
    "memory_report",  # per-IPU memory estimate
    "time_report",  # predicted IPU time per call
]
