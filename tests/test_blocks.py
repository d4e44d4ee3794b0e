"""Block annotations, execution strategies, printing and the isRunningOnIpu switch."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from poptorch_sim.enums import AutoStage, Liveness
from poptorch_sim.errors import Error
from poptorch_sim.ipu_context import isRunningOnIpu, running_on_ipu
from poptorch_sim.ops.blocks import (
    BeginBlock,
    Block,
    BlockFunction,
    LegacyBeginBlockFn,
    recording_blocks,
    removeBlocks,
)
from poptorch_sim.options.strategies import (
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    Placement,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
)
from poptorch_sim.printing import module_repr
from poptorch_sim.printing import print as pprint


class FakeRecorder:
    """Records block events as strings."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._auto = 0

    def begin_block(self, user_id, ipu_id) -> None:
        self.events.append(f"begin {user_id or self.next_auto_id()} {ipu_id}")

    def end_block(self) -> None:
        self.events.append("end")

    def next_auto_id(self) -> str:
        self._auto += 1
        return str(self._auto - 1)

    def reset_auto_id(self) -> None:
        self._auto = 0


class Annotated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = BeginBlock(nn.Linear(4, 4), "Bb", ipu_id=1)
        self.c = nn.Linear(4, 2)

    def forward(self, x):
        with Block("Ba", ipu_id=0):
            x = self.a(x)
        x = self.b(x)
        return self.helper(x)

    @BlockFunction("Bc", ipu_id=2)
    def helper(self, x):
        return self.c(x).relu()


def test_annotations_are_no_ops_eagerly():
    model = Annotated()
    x = torch.randn(3, 4)
    expected = model.c(model.b(model.a(x))).relu()
    torch.testing.assert_close(model(x), expected)
    Block.useAutoId()
    Block.start("anything", 3)
    assert not isRunningOnIpu()


def test_annotations_report_to_the_active_recorder_in_order():
    model = Annotated()
    recorder = FakeRecorder()
    with recording_blocks(recorder):
        model(torch.randn(2, 4))
    assert recorder.events == ["begin Ba 0", "end", "begin Bb 1", "begin Bc 2", "end"]


def test_auto_ids_and_use_auto_id():
    recorder = FakeRecorder()
    with recording_blocks(recorder):
        with Block():
            pass
        with Block("named"):
            pass
        Block.useAutoId()
        Block.start()
    assert recorder.events == ["begin 0 None", "end", "begin named None", "end", "begin 0 None"]


def test_begin_block_hook_fixes_its_auto_id_on_first_use():
    layer = BeginBlock(nn.ReLU())
    for _ in range(2):
        recorder = FakeRecorder()
        recorder._auto = 5
        with recording_blocks(recorder):
            layer(torch.ones(1))
        assert recorder.events == ["begin 5 None"]


def test_begin_block_returns_the_same_module_and_rejects_a_second_block():
    layer = nn.Linear(2, 2)
    assert BeginBlock(layer, "B1", ipu_id=0) is layer
    with pytest.raises(Error, match="module has already been assigned to a block."):
        BeginBlock(layer, "B2")


def test_begin_block_wraps_plain_callables():
    wrapped = BeginBlock(lambda x: x * 2, "F", ipu_id=1)
    assert isinstance(wrapped, LegacyBeginBlockFn)
    torch.testing.assert_close(wrapped(torch.ones(2)), torch.full((2,), 2.0))
    recorder = FakeRecorder()
    with recording_blocks(recorder):
        wrapped(torch.ones(1))
    assert recorder.events == ["begin F 1"]


@pytest.mark.parametrize("ipu_id", [-1, 1.5, True], ids=["negative", "float", "bool"])
def test_every_annotation_refuses_an_ipu_id_that_is_not_an_index(ipu_id):
    for where, make in [
        ("BeginBlock", lambda: BeginBlock(nn.Linear(2, 2), "B", ipu_id=ipu_id)),
        ("Block", lambda: Block("B", ipu_id=ipu_id)),
        ("Block.start", lambda: Block.start("B", ipu_id=ipu_id)),
        ("BlockFunction", lambda: BlockFunction("B", ipu_id=ipu_id)),
    ]:
        with pytest.raises(AssertionError, match=f"{where} expects ipu_id .* got {ipu_id!r}"):
            make()


def test_begin_block_rejects_non_callables():
    with pytest.raises(Error, match="module is not an instance of torch.nn.Module or function."):
        BeginBlock(42)  # type: ignore[arg-type]


def test_remove_blocks_strips_every_begin_block():
    model = Annotated()
    other_hook = model.b.register_forward_pre_hook(lambda m, a: None)
    removeBlocks(model)
    assert "BeginBlock" not in module_repr(model)
    assert len(model.b._forward_pre_hooks) == 1
    other_hook.remove()
    BeginBlock(model.b, "again")  # allowed once the old annotation is gone
    with pytest.raises(AssertionError, match="expects a torch.nn.Module"):
        removeBlocks("model")  # type: ignore[arg-type]


def test_module_repr_shows_begin_block_and_print_prints_both(capsys):
    model = Annotated()
    text = module_repr(model)
    assert "(b): BeginBlock(user_id=Bb, ipu_id=1) Linear(in_features=4" in text
    assert text.replace("BeginBlock(user_id=Bb, ipu_id=1) ", "") == repr(model)
    pprint(model)
    assert capsys.readouterr().out == f"{text}\n{model!r}\n"


def test_running_on_ipu_is_per_thread_unless_all_threads():
    seen = []

    def probe() -> None:
        seen.append(isRunningOnIpu())

    with running_on_ipu():
        assert isRunningOnIpu()
        worker = threading.Thread(target=probe)
        worker.start()
        worker.join()
        with running_on_ipu():
            assert isRunningOnIpu()
        assert isRunningOnIpu()
    with running_on_ipu(all_threads=True):
        worker = threading.Thread(target=probe)
        worker.start()
        worker.join()
    assert seen == [False, True]
    assert not isRunningOnIpu()


# ---- strategies -------------------------------------------------------------------------------


def test_stage_rejects_non_string_block_ids():
    with pytest.raises(AssertionError, match="Block IDs are supposed to be strings but got"):
        Stage("B1", 2)  # type: ignore[arg-type]
    assert Stage("B1", "B2").ipu(3).blocks == ("B1", "B2")


def _place(strategy, entries):
    placer = strategy.placer()
    return [placer.place(block, ipu) for block, ipu in entries]


@pytest.mark.parametrize(
    "strategy, entries, expected",
    [
        pytest.param(
            PipelinedExecution(),
            [("A", 0), ("B", 1), ("A", 0)],
            [(0, -1, 0), (1, -1, 1), (0, -1, 0)],
            id="same-as-ipu",
        ),
        pytest.param(
            PipelinedExecution(AutoStage.AutoIncrement),
            [("A", 0), ("B", 1), ("C", 0), ("B", 1), ("D", None)],
            [(1, -1, 0), (2, -1, 1), (3, -1, 0), (2, -1, 1), (4, -1, 4)],
            id="auto-increment",
        ),
        pytest.param(
            PipelinedExecution(Stage("A").ipu(3), "B", ["C", "D"]),
            [("A", None), ("B", None), ("C", 5), ("D", None)],
            [(0, -1, 3), (1, -1, 1), (2, -1, 5), (2, -1, 2)],
            id="explicit-stages",
        ),
        pytest.param(
            ShardedExecution("A", "B"),
            [("A", None), ("B", 0)],
            [(0, -1, 0), (1, -1, 0)],
            id="sharded",
        ),
        pytest.param(
            SerialPhasedExecution(Phase(Stage("A"), Stage("B").ipu(3)), ["C"], "D"),
            [("A", None), ("B", None), ("C", None), ("D", 1)],
            [(-1, 0, 0), (-1, 0, 3), (-1, 1, 0), (-1, 2, 1)],
            id="serial-phases",
        ),
    ],
)
def test_placements(strategy, entries, expected):
    assert _place(strategy, entries) == [Placement(*p) for p in expected]


def test_same_as_ipu_needs_an_ipu():
    with pytest.raises(AssertionError, match="SameAsIpu was selected but no IPU was specified"):
        _place(PipelinedExecution(AutoStage.SameAsIpu), [("B1", None)])


def test_unknown_block():
    with pytest.raises(AssertionError, match=r"Unknown Block 'X' list of expected Blocks: \['A'"):
        _place(PipelinedExecution("A", "B"), [("X", 0)])
    with pytest.raises(AssertionError, match="Unknown Block 'X'"):
        _place(SerialPhasedExecution(["A"]), [("X", 0)])
    with pytest.raises(AssertionError, match="Unknown block X"):
        PipelinedExecution("A").stage("X")


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: PipelinedExecution("A", Stage("B", "A")), id="pipelined"),
        pytest.param(lambda: ShardedExecution(["A", "B"], "B"), id="sharded"),
        pytest.param(lambda: ParallelPhasedExecution(["A"], Phase("A")), id="phased"),
    ],
)
def test_block_in_two_stages(make):
    with pytest.raises(AssertionError, match="A associated with more than one stage|B associated"):
        make()


def test_pipelined_rejects_bad_arguments():
    with pytest.raises(AssertionError, match="must be a single poptorch.AutoStage"):
        PipelinedExecution(AutoStage.AutoIncrement, "A")


def test_phase_validation():
    with pytest.raises(AssertionError, match="All arguments must either be block IDs"):
        Phase("A", Stage("B"))
    with pytest.raises(AssertionError, match="Phase contains 2 stages but you provided 1 ipus"):
        Phase(Stage("A"), Stage("B")).ipus(0)
    with pytest.raises(
        AssertionError, match="There is currently no AutoStage for PhasedExecution"
    ):
        SerialPhasedExecution()
    strategy = ParallelPhasedExecution(Phase(Stage("A"), Stage("B")), ["C"])
    strategy.phase(0).ipus(0, 2)
    assert strategy.phase(0).stage(1)._ipu == 2
    with pytest.raises(AssertionError, match="Phases are identified by positive integers"):
        strategy.phase(-1)


def test_backend_options_and_liveness():
    serial = SerialPhasedExecution(["A"]).setTensorsLiveness(Liveness.OffChipAfterEachPhase)
    assert serial.backendOptions() == {
        "execution_mode": 2,
        "separate_backward_phase": False,
        "tensors_liveness": int(Liveness.OffChipAfterEachPhase),
        "serial_phases_execution": True,
    }
    parallel = ParallelPhasedExecution(["A"]).sendTensorsOffChipAfterFwd()
    assert parallel.useSeparateBackwardPhase().backendOptions()["separate_backward_phase"]
    assert ShardedExecution().backendOptions() == {"execution_mode": 1}
    assert repr(PipelinedExecution()) == "PipelinedExecution(AutoStage.SameAsIpu)"
