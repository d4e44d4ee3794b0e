"""Execution strategies: how a model's blocks map to stages, phases and IPUs (reference §1.6, §2.9).

A strategy is pure configuration. The compiler asks it for a fresh ``placer`` per compilation
and replays the block entries it saw while tracing ``forward`` through it; each entry gets a
``Placement`` (stage, phase, IPU). Nothing here runs at import or construction time beyond
recording arguments, so ``Options()`` can build its default strategy cheaply.

    strategy                         stage of a block                      IPU of a block
    PipelinedExecution(SameAsIpu)    its ipu_id                            its ipu_id
    PipelinedExecution(AutoIncr.)    1, 2, 3, ... by first entry           ipu_id, else stage
    PipelinedExecution(Stage, ...)   position of its Stage in the list     Stage.ipu(), ipu_id, stage
    Serial/ParallelPhasedExecution   its phase (stage order: phase)        Stage.ipu(), ipu_id, index
                                                                           of the Stage in its Phase
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from ..enums import AutoStage, Liveness
from ..logger import logger

__all__ = [
    "Stage",
    "Phase",
    "Placement",
    "PipelinedExecution",
    "ShardedExecution",
    "SerialPhasedExecution",
    "ParallelPhasedExecution",
    "_IExecutionStrategy",
]

BlockId = str


class Placement(NamedTuple):
    """Where the ops of one block entry run.

    Attributes:
        stage: pipeline stage id (pipelined / sharded); -1 for phased strategies.
        phase: execution phase id (phased strategies); -1 otherwise.
        ipu: the IPU.
    """

    stage: int
    phase: int
    ipu: int


class Stage:
    """One or more blocks that run together on one IPU.

    Args:
        *block_ids: the ``user_id`` of each block in the stage.

    Raises:
        AssertionError: a block id is not a string (PopTorch's type and wording).

    >>> Stage("B1", "B2").ipu(1).blocks
    ('B1', 'B2')
    """

    def __init__(self, *block_ids: BlockId) -> None:
        if not all(isinstance(b, str) for b in block_ids):
            raise AssertionError(f"Block IDs are supposed to be strings but got {block_ids}")
        self._blocks = block_ids
        self._stage_id = -1
        self._phase_id = -1
        self._ipu: int | None = None

    @property
    def blocks(self) -> tuple[BlockId, ...]:
        """The block ids this stage is made of."""
        return self._blocks

    def ipu(self, ipu: int) -> Stage:
        """Run this stage on IPU ``ipu`` (overrides the blocks' own ``ipu_id``).

        Raises:
            AssertionError: ``ipu`` is not a non-negative int.
        """
        if not isinstance(ipu, int) or isinstance(ipu, bool) or ipu < 0:
            raise AssertionError(f"Stage.ipu() expects a non-negative int but got {ipu!r}")
        self._ipu = ipu
        return self

    def _setStage(self, stage: int | None) -> Stage:
        if stage is not None:
            self._stage_id = stage
        return self

    def __repr__(self) -> str:
        ipu = "" if self._ipu is None else f".ipu({self._ipu})"
        return f"Stage({', '.join(repr(b) for b in self._blocks)}){ipu}"


def _unknown_block(block_id: str, block_map: dict[str, Stage]) -> AssertionError:
    return AssertionError(
        f"Unknown Block '{block_id}' list of expected Blocks: {list(block_map.keys())}"
    )


class _Placer:
    """Maps block entries to placements for one compilation (PopTorch's stage manager)."""

    def __init__(self, block_map: dict[str, Stage], auto_stage: AutoStage | None):
        self._block_map = block_map
        self._auto_stage = auto_stage
        self._auto_stages: dict[str, int] = {}
        self._next_stage = 1

    def place(self, block_id: str, ipu_id: int | None) -> Placement:
        """Placement of one entry into block ``block_id`` entered with ``ipu_id``.

        Raises:
            AssertionError: unknown block, or ``SameAsIpu`` with no IPU (PopTorch's wording).
        """
        if self._auto_stage is not None:
            return self._place_auto(block_id, ipu_id)
        stage = self._block_map.get(block_id)
        if stage is None:
            raise _unknown_block(block_id, self._block_map)
        ipu = stage._ipu if stage._ipu is not None else ipu_id
        if stage._phase_id >= 0:
            if ipu is None:
                ipu = _index_in_phase(stage)
            return Placement(-1, stage._phase_id, ipu)
        return Placement(stage._stage_id, -1, stage._stage_id if ipu is None else ipu)

    def _place_auto(self, block_id: str, ipu_id: int | None) -> Placement:
        stage_id = self._auto_stages.get(block_id)
        if stage_id is None:
            if self._auto_stage == AutoStage.SameAsIpu:
                if ipu_id is None:
                    raise AssertionError(
                        "poptorch.AutoStage.SameAsIpu was selected but no IPU was specified "
                        f"for block {block_id}"
                    )
                stage_id = ipu_id
            else:
                stage_id = self._next_stage
                self._next_stage += 1
            self._auto_stages[block_id] = stage_id
        return Placement(stage_id, -1, stage_id if ipu_id is None else ipu_id)


def _index_in_phase(stage: Stage) -> int:
    # Simulated: PopTorch leaves the IPU undefined here; the n-th stage of a phase uses IPU n.
    owner = getattr(stage, "_phase", None)
    return 0 if owner is None else list(owner.stages).index(stage)


class _IExecutionStrategy:
    """Base of every execution strategy: a block → ``Stage`` map and how to place blocks."""

    # Set by subclasses: "pipelined", "sharded" or "phased".
    mode = "pipelined"

    def __init__(self, block_map: dict[str, Stage], auto_stage: AutoStage | None = None):
        self._block_map = block_map
        self._auto_stage = auto_stage

    def stage(self, block_id: BlockId) -> Stage:
        """The ``Stage`` that block ``block_id`` belongs to.

        Raises:
            AssertionError: the block is not part of this strategy.
        """
        if block_id not in self._block_map:
            raise AssertionError(f"Unknown block {block_id}")
        return self._block_map[block_id]

    def placer(self) -> _Placer:
        """A fresh block → placement mapper for one compilation."""
        return _Placer(self._block_map, self._auto_stage)

    def backendOptions(self) -> dict[str, Any]:
        """The strategy's settings as PopTorch hands them to its backend."""
        return {}

    def __repr__(self) -> str:
        if self._auto_stage is not None:
            return f"{type(self).__name__}(AutoStage.{self._auto_stage.name})"
        stages: dict[int, Stage] = {}
        for stage in self._block_map.values():
            stages[id(stage)] = stage
        return f"{type(self).__name__}({', '.join(repr(s) for s in stages.values())})"


def _as_stage(arg: Any) -> Stage:
    if isinstance(arg, Stage):
        return arg
    if isinstance(arg, str):
        return Stage(arg)
    if isinstance(arg, Iterable) and all(isinstance(elt, str) for elt in arg):
        return Stage(*arg)
    raise AssertionError(
        "PipelinedExecution arguments must be a single poptorch.AutoStage, or Stages, block ids "
        f"(strings) or lists of block ids, but got {arg!r}"
    )


def _add_blocks(block_map: dict[str, Stage], stage: Stage, where: str) -> None:
    for block in stage.blocks:
        if block in block_map:
            raise AssertionError(f"{block} associated with more than one stage")
        ipu = "" if stage._ipu is None else f" on IPU {stage._ipu}"
        logger.debug("block %s added to %s%s", block, where, ipu)
        block_map[block] = stage


class PipelinedExecution(_IExecutionStrategy):
    """Pipeline the model's stages over IPUs (the default strategy).

    Args:
        *args: a single ``AutoStage`` (default ``AutoStage.SameAsIpu``: stage = the block's
            ``ipu_id``), or an explicit list of stages, each a ``Stage``, a block id or a list of
            block ids (stage index = position in the list).

    Raises:
        AssertionError: a block in more than one stage, or arguments of the wrong type.

    >>> PipelinedExecution(Stage("B1").ipu(0), "B2", ["B3", "B4"]).stage("B3").blocks
    ('B3', 'B4')
    """

    mode = "pipelined"

    def __init__(self, *args: Any) -> None:
        if not args:
            super().__init__({}, AutoStage.SameAsIpu)
            return
        if len(args) == 1 and isinstance(args[0], AutoStage):
            super().__init__({}, args[0])
            return
        block_map: dict[str, Stage] = {}
        for stage_id, arg in enumerate(args):
            stage = _as_stage(arg)._setStage(stage_id)
            _add_blocks(block_map, stage, f"stage {stage_id}")
        super().__init__(block_map, None)

    def backendOptions(self) -> dict[str, Any]:
        return {"execution_mode": 0}


class ShardedExecution(PipelinedExecution):
    """Run the stages one after the other, one micro-batch at a time (no pipelining).

    Takes the same arguments as ``PipelinedExecution``; has no pipeline-depth constraint.

    >>> ShardedExecution("B1", "B2").stage("B2")._stage_id
    1
    """

    mode = "sharded"

    def backendOptions(self) -> dict[str, Any]:
        return {"execution_mode": 1}


class Phase:
    """An execution phase: stages that run at the same time on different IPUs.

    Args:
        *arg: ``Stage``s, or block ids (strings) that together make one ``Stage``.

    Raises:
        AssertionError: a mix of both, or other types (PopTorch's wording).

    >>> len(Phase(Stage("A"), Stage("B")).stages), len(Phase("A", "B").stages)
    (2, 1)
    """

    def __init__(self, *arg: BlockId | Stage) -> None:
        if all(isinstance(elt, Stage) for elt in arg):
            self.stages: list[Stage] = list(arg)  # type: ignore[arg-type]
        else:
            if not all(isinstance(elt, str) for elt in arg):
                raise AssertionError(
                    "All arguments must either be block IDs (strings) or Stages: "
                    + str([type(elt) for elt in arg])
                )
            self.stages = [Stage(*arg)]  # type: ignore[arg-type]
        for stage in self.stages:
            stage._phase = self  # type: ignore[attr-defined]

    def stage(self, idx: int) -> Stage:
        """The ``idx``-th stage of the phase."""
        return self.stages[idx]

    def ipus(self, *ipus: int) -> None:
        """Put the phase's stages on these IPUs, one IPU per stage.

        Raises:
            AssertionError: not one IPU per stage.
        """
        if len(ipus) != len(self.stages):
            raise AssertionError(
                f"Phase contains {len(self.stages)} stages but you provided {len(ipus)} ipus"
            )
        for stage, ipu in zip(self.stages, ipus):
            stage.ipu(ipu)


class _IPhasedExecution(_IExecutionStrategy):
    """Common base of the phased strategies.

    Simulated: phases run as ordered shards, one after the other, in phase order.
    """

    mode = "phased"

    def __init__(self, *phases: Phase | list[Stage] | list[BlockId] | BlockId) -> None:
        if not phases:
            raise AssertionError(
                "There is currently no AutoStage for PhasedExecution, please explicitly "
                "specify the phases"
            )
        self._tensors_liveness = Liveness.AlwaysLive
        self._separate_backward_phase = False
        self._phases: list[Phase] = []
        block_map: dict[str, Stage] = {}
        for phase_id, args in enumerate(phases):
            if isinstance(args, Phase):
                phase = args
            else:
                items = args if isinstance(args, list) else [args]
                phase = Phase(*items)
            self._phases.append(phase)
            for stage in phase.stages:
                stage._phase_id = phase_id
                _add_blocks(block_map, stage, f"phase {phase_id}")
        super().__init__(block_map, None)

    def phase(self, phase: int) -> Phase:
        """The ``phase``-th ``Phase``.

        Raises:
            AssertionError: ``phase`` is not a non-negative int.
        """
        if not isinstance(phase, int) or phase < 0:
            raise AssertionError("Phases are identified by positive integers")
        return self._phases[phase]

    def useSeparateBackwardPhase(self, use: bool = True) -> _IPhasedExecution:
        """Do not share a phase between the end of forward and the start of backward."""
        if not isinstance(use, bool):
            raise AssertionError(f"use must be a bool but got {use!r}")
        self._separate_backward_phase = use
        return self

    def backendOptions(self) -> dict[str, Any]:
        return {
            "execution_mode": 2,
            "separate_backward_phase": self._separate_backward_phase,
            "tensors_liveness": int(self._tensors_liveness),
        }


class ParallelPhasedExecution(_IPhasedExecution):
    """Phases alternate between two groups of IPUs: even phases on even IPUs, odd on odd.

    >>> s = ParallelPhasedExecution(Phase(Stage("A")), Phase(Stage("B")))
    >>> s.phase(1).ipus(1)
    """

    serial = False

    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True) -> ParallelPhasedExecution:
        """Move tensors off chip at the end of the forward pass."""
        if not isinstance(off_chip, bool):
            raise AssertionError(f"off_chip must be a bool but got {off_chip!r}")
        self._tensors_liveness = Liveness.OffChipAfterFwd if off_chip else Liveness.AlwaysLive
        return self

    def backendOptions(self) -> dict[str, Any]:
        return {**super().backendOptions(), "serial_phases_execution": False}


class SerialPhasedExecution(_IPhasedExecution):
    """All phases run one after the other on the same group of IPUs.

    >>> SerialPhasedExecution(["A"], ["B"]).setTensorsLiveness(Liveness.OffChipAfterEachPhase)
    SerialPhasedExecution(Stage('A'), Stage('B'))
    """

    serial = True

    def setTensorsLiveness(self, liveness: Liveness) -> SerialPhasedExecution:
        """Where tensors live between phases (see ``Liveness``)."""
        if not isinstance(liveness, Liveness):
            raise AssertionError(f"liveness must be a poptorch.Liveness but got {liveness!r}")
        self._tensors_liveness = liveness
        return self

    def backendOptions(self) -> dict[str, Any]:
        return {**super().backendOptions(), "serial_phases_execution": True}
