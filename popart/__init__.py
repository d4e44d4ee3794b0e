"""The few PopART enums that PopTorch programs read (``import popart`` for option values).

Simulated: there is no PopART session; these enums exist so that such programs import and pass
their values to ``Options._Popart.set``, which stores them.
"""

import enum


class SubgraphCopyingStrategy(enum.IntEnum):
    OnEnterAndExit = 0
    JustInTime = 1


class AccumulateOuterFragmentSchedule(enum.IntEnum):
    Scheduler = 0
    Serial = 1
    OverlapCycleOptimized = 2
    OverlapMemoryOptimized = 3


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.IntEnum):
    Running = 0
    Post = 1
    PostAndLoss = 2


class VirtualGraphMode(enum.IntEnum):
    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


class RecomputationType(enum.IntEnum):
    NoRecompute = 0
    Standard = 1
    NormOnly = 2
    Pipeline = 3
    RecomputeAll = 4


class SyntheticDataMode(enum.IntEnum):
    """What fills the input streams when host IO is off (``Options.enableSyntheticData``)."""

    Off = 0
    Zeros = 1
    RandomNormal = 2
    RandomUniform = 3
    N = 4


class BatchSerializationBatchSchedule(enum.IntEnum):
    Scheduler = 0
    Isomorphic = 1
    OverlapOnIo = 2
    OverlapOnCompute = 3
    N = 4


__version__ = "3.4.0+sim"
