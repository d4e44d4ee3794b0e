"""PopTorch's enumerations, with PopTorch's member names and values."""

from __future__ import annotations

import enum

__all__ = [
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
]


class MeanReductionStrategy(enum.IntEnum):
    """Where the division of a Mean gradient reduction happens (numerics only)."""

    Running = 0
    Post = 1
    PostAndLoss = 2


class DataLoaderMode(enum.IntEnum):
    """How ``poptorch.DataLoader`` produces batches."""

    Sync = 0
    Async = 1
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    """How an asynchronous loader shares tensors with its worker."""

    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class OutputMode(enum.IntEnum):
    """Which micro-batches' outputs a call returns (reference §2.3)."""

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


# PopTorch 2.x name for OutputMode.
AnchorMode = OutputMode


class ConnectionType(enum.IntEnum):
    """When the device is acquired."""

    Always = 0
    OnDemand = 1
    Never = 2


class HalfFloatCastingBehavior(enum.IntEnum):
    """Deprecated in PopTorch; kept so old scripts still import it."""

    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1
    Default = 2


class ReductionType(enum.IntEnum):
    """How gradients are combined across accumulation steps and replicas."""

    Sum = 0
    Mean = 1
    NoReduction = 2


class SyncPattern(enum.IntEnum):
    """Host synchronisation pattern of the device."""

    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class MatMulSerializationMode(enum.Enum):
    """Which dimension ``serializedMatMul`` splits."""

    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class Liveness(enum.IntEnum):
    """Where tensors live between phases of phased execution."""

    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class OverlapMode(enum.Enum):
    """Overlapped IO mode of an input or output."""

    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class AutoStage(enum.IntEnum):
    """How blocks are mapped to pipeline stages when no explicit stages are given."""

    SameAsIpu = 0
    AutoIncrement = 1


class MultiConvPlanType(enum.IntEnum):
    """Planning strategy of a ``MultiConv``."""

    Parallel = 0
    Serial = 1


class CommGroupType(enum.IntEnum):
    """How replicas are grouped."""

    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


class VariableRetrievalMode(enum.IntEnum):
    """Which replicas' copies of a grouped variable are read back."""

    OnePerGroup = 0
    AllReplicas = 2
