"""The compiler: stage assignment, PopTorch's compile errors, and split programs equal to eager.

Split programs are executed here by hand, stage by stage, without threads: values cross stage
boundaries detached (as the runtime does), each stage runs its own backward, and gradients are
passed upstream explicitly. Eager PyTorch is the oracle.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import poptorch_sim
import poptorch_sim.ops.loss as loss_ops
from poptorch_sim.compiler import (
    TraceFailure,
    compile_program,
    describe,
    flatten_inputs,
    rebuild_output,
    uses_blocks,
)
from poptorch_sim.compiler.tracer import trace_model
from poptorch_sim.enums import AutoStage
from poptorch_sim.errors import Error
from poptorch_sim.ipu_context import isRunningOnIpu
from poptorch_sim.ops.blocks import BeginBlock, Block, BlockFunction
from poptorch_sim.ops.loss import identity_loss
from poptorch_sim.options import Options
from poptorch_sim.options.strategies import (
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
)

# ---- models -----------------------------------------------------------------------------------


class ConvLayer(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=5)
        self.pool = nn.MaxPool2d(2)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.pool(self.conv(x)))


class TutorialNet(nn.Module):
    """The shape of the pipelining tutorial's MNIST network: four blocks B1..B4."""

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = ConvLayer(1, 4)
        self.layer2 = ConvLayer(4, 8)
        self.layer3 = nn.Linear(128, 32)
        self.layer3_act = nn.ReLU()
        self.layer4 = nn.Linear(32, 10)

    def forward(self, x):
        with Block("B1"):
            x = self.layer1(x)
        with Block("B2"):
            x = self.layer2(x)
        with Block("B3"):
            x = torch.flatten(x, 1)
            x = self.layer3_act(self.layer3(x))
        with Block("B4"):
            x = F.log_softmax(self.layer4(x), dim=1)
        return x


class WithLoss(nn.Module):
    """The tutorial's wrapper: the loss is computed in block B4, entered a second time."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, args, labels=None):
        output = self.model(args)
        if labels is None:
            return output
        with Block("B4"):
            loss = self.loss(output, labels)
        return output, loss


TUTORIAL_STAGES = PipelinedExecution(
    Stage("B1").ipu(0), Stage("B2").ipu(1), Stage("B3").ipu(2), Stage("B4").ipu(3)
)


class SkipNet(nn.Module):
    """Stage 0's output skips stage 1 and is used again in stage 2."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(6, 6)
        self.l2 = nn.Linear(6, 6)
        self.l3 = nn.Linear(6, 6)

    def forward(self, x, target):
        with Block("A", ipu_id=0):
            a = self.l1(x).relu()
        with Block("B", ipu_id=1):
            b = self.l2(a).tanh()
        with Block("C", ipu_id=2):
            c = self.l3(b) + a
            loss = F.mse_loss(c, target)
        return {"out": c, "extra": [b, None]}, loss


class TiedHead(nn.Module):
    """The output head goes back to IPU 0 and reuses the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.body = nn.Linear(8, 8)

    def forward(self, tokens, labels):
        with Block("emb", ipu_id=0):
            h = self.emb(tokens)
        with Block("body", ipu_id=1):
            h = self.body(h).relu()
        with Block("head", ipu_id=0):
            logits = F.linear(h, self.emb.weight)
            loss = F.cross_entropy(logits, labels)
        return loss


def _options(ga=1, di=1, strategy=None, replicas=1, auto_round=True) -> Options:
    opts = Options().deviceIterations(di).replicationFactor(replicas).autoRoundNumIPUs(auto_round)
    opts.Training.gradientAccumulation(ga)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    return opts


# ---- running a program by hand ----------------------------------------------------------------


def _forward(program, inputs):
    values = dict(zip(program.input_names, inputs))
    saved = []
    for stage in program.stages:
        args = []
        for name in stage.inputs:
            value = values[name]
            if name not in program.input_names and value.is_floating_point():
                value = value.detach().requires_grad_()
            args.append(value)
        outs = stage.module(*args)
        assert isinstance(outs, tuple) and len(outs) == len(stage.outputs)
        saved.append((args, outs))
        values.update(zip(stage.outputs, outs))
    return values, saved


def _backward(program, values, saved):
    grads = {program.loss_name: torch.ones_like(values[program.loss_name])}
    for stage, (args, outs) in reversed(list(zip(program.stages, saved))):
        pairs = [
            (out, grads[name])
            for name, out in zip(stage.outputs, outs)
            if name in grads and out.requires_grad
        ]
        if pairs:
            torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
        for name, arg in zip(stage.inputs, args):
            if arg.grad is not None:
                grads[name] = grads[name] + arg.grad if name in grads else arg.grad


def _check_training(model, args, options, loss_of=lambda out: out[-1]):
    reference = copy.deepcopy(model)
    program = compile_program(model, options, args, {}, training=True)
    values, saved = _forward(program, flatten_inputs(program.meta["signature"], args, {}))
    _backward(program, values, saved)
    out = rebuild_output(program, [values[n] for n in program.output_names])
    expected = reference(*args)
    torch.testing.assert_close(out, expected)
    loss = expected if isinstance(expected, torch.Tensor) else loss_of(expected)
    loss.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=f"gradient of {name}")
    return program


# ---- numerics ---------------------------------------------------------------------------------


def test_tutorial_network_training_matches_eager():
    model = WithLoss(TutorialNet())
    args = (torch.randn(5, 1, 28, 28), torch.randint(0, 10, (5,)))
    program = _check_training(model, args, _options(ga=7, strategy=TUTORIAL_STAGES))
    assert [(s.ipu, s.blocks) for s in program.stages] == [
        (0, ("B1",)),
        (1, ("B2",)),
        (2, ("B3",)),
        (3, ("B4",)),
    ]
    assert program.loss_name in program.stages[3].outputs
    loss_node = next(n for n in program.stages[3].module.graph.nodes if n.name == "loss")
    assert (loss_node.meta["block"], loss_node.meta["stage"], loss_node.meta["ipu"]) == (
        "B4",
        3,
        3,
    )
    assert program.meta["loss_stage"] == 3
    assert program.meta["forward_stages"] == 4 and program.meta["pipeline_stages"] == 7
    assert program.input_names == ("args", "labels")
    assert not program.sharded


def test_tutorial_network_inference_matches_eager():
    net = TutorialNet()
    x = torch.randn(3, 1, 28, 28)
    program = compile_program(
        WithLoss(net), _options(di=4, strategy=TUTORIAL_STAGES), (x,), {}, False
    )
    values, _ = _forward(program, [x])
    torch.testing.assert_close(
        rebuild_output(program, [values[n] for n in program.output_names]), net(x)
    )
    assert program.loss_name is None
    assert program.input_names == ("args",)


def test_value_skipping_a_stage_and_nested_outputs():
    model = SkipNet()
    args = (torch.randn(4, 6), torch.randn(4, 6))
    program = _check_training(model, args, _options(ga=5))
    first, _, last = program.stages
    assert set(first.outputs) <= set(last.inputs)
    assert "relu" in last.inputs and "relu" in program.stages[1].inputs
    assert program.meta["out_constants"] == {2: None}


def test_head_back_on_ipu0_with_tied_weights_auto_increment():
    model = TiedHead()
    args = (torch.randint(0, 10, (6,)), torch.randint(0, 10, (6,)))
    opts = _options(ga=5, strategy=PipelinedExecution(AutoStage.AutoIncrement))
    program = _check_training(model, args, opts)
    assert [s.ipu for s in program.stages] == [0, 1, 0]
    emb = model.emb.weight
    assert any(p is emb for p in program.stages[0].module.parameters())
    assert any(p is emb for p in program.stages[2].module.parameters())


def test_same_as_ipu_cannot_return_to_an_earlier_stage():
    args = (torch.randint(0, 10, (6,)), torch.randint(0, 10, (6,)))
    with pytest.raises(Error, match="computed later in the pipeline.*AutoStage.AutoIncrement"):
        compile_program(TiedHead(), _options(ga=5), args, {}, True)


def test_stage_modules_share_the_models_objects():
    model = WithLoss(TutorialNet())
    args = (torch.randn(2, 1, 28, 28), torch.randint(0, 10, (2,)))
    program = compile_program(model, _options(ga=7, strategy=TUTORIAL_STAGES), args, {}, True)
    ids = {id(p) for stage in program.stages for p in stage.module.parameters()}
    assert ids == {id(p) for p in model.parameters()}
    assert not hasattr(model, "_tensor_constant0")


class PartlyFrozen(nn.Module):
    """A no_grad region inside a block, and outputs that no stage computes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x, y):
        with Block("A", ipu_id=0):
            with torch.no_grad():
                frozen = self.a(x)
            h = self.a(x) + frozen
        with Block("B", ipu_id=1):
            loss = F.mse_loss(self.b(h), y)
        return x, self.b.bias, loss


def test_no_grad_regions_and_passed_through_outputs():
    model = PartlyFrozen()
    args = (torch.randn(4, 3), torch.randn(4, 3))
    with torch.no_grad():  # compiling under no_grad must not freeze the program
        reference = copy.deepcopy(model)
        program = compile_program(model, _options(ga=3), args, {}, training=True)
    values, saved = _forward(program, list(args))
    _backward(program, values, saved)
    out = rebuild_output(program, [values[n] for n in program.output_names])
    expected = reference(*args)
    expected[-1].backward()
    torch.testing.assert_close(out, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert program.output_names[:2] == ("x", "b_bias")
    assert {"x", "b_bias"} <= set(program.stages[-1].outputs)
    assert torch.is_grad_enabled()


# ---- stage assignment -------------------------------------------------------------------------


class Chain(nn.Module):
    """Blocks given as (block id, ipu id) pairs, one Linear each; optional op before them."""

    def __init__(self, blocks, pre_op: bool = False) -> None:
        super().__init__()
        self.blocks = blocks
        self.pre_op = pre_op
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in blocks)

    def forward(self, x):
        if self.pre_op:
            x = x * 2
        for (block, ipu), layer in zip(self.blocks, self.layers):
            with Block(block, ipu_id=ipu):
                x = layer(x)
        return x


@pytest.mark.parametrize(
    "blocks, pre_op, strategy, expected",
    [
        pytest.param([("A", 0), ("B", 1)], False, None, [(0, "A"), (1, "B")], id="same-as-ipu"),
        pytest.param(
            [("A", 0), ("B", 0), ("C", 1)], False, None, [(0, "AB"), (1, "C")], id="merge-same-ipu"
        ),
        pytest.param(
            [("A", 1), ("B", 2)], True, None, [(0, ""), (1, "A"), (2, "B")], id="pre-block-ipu0"
        ),
        pytest.param(
            [("A", None), ("B", None)],
            False,
            PipelinedExecution(AutoStage.AutoIncrement),
            [(1, "A"), (2, "B")],
            id="auto-increment-ipu-from-stage",
        ),
        pytest.param(
            [("A", None), ("B", None), ("C", None)],
            False,
            PipelinedExecution(Stage("A", "B").ipu(1), Stage("C").ipu(0)),
            [(1, "AB"), (0, "C")],
            id="explicit-decreasing-ipus",
        ),
        pytest.param(
            [("A", None), ("B", None)],
            False,
            ShardedExecution("A", "B"),
            [(0, "A"), (1, "B")],
            id="sharded",
        ),
        pytest.param(
            [("A", None), ("B", None), ("C", None)],
            False,
            SerialPhasedExecution(Phase(Stage("A").ipu(0), Stage("B").ipu(1)), Phase("C")),
            [(0, "A"), (1, "B"), (0, "C")],
            id="serial-phases",
        ),
    ],
)
def test_stage_assignment(blocks, pre_op, strategy, expected):
    model = Chain(blocks, pre_op)
    x = torch.randn(2, 3)
    opts = _options(di=4, strategy=strategy)
    program = compile_program(model, opts, (x,), {}, False)
    assert [(s.ipu, "".join(s.blocks)) for s in program.stages] == expected
    assert [s.index for s in program.stages] == list(range(len(expected)))
    values, _ = _forward(program, [x])
    torch.testing.assert_close(values[program.output_names[0]], model(x))
    assert program.sharded == (strategy is not None and strategy.mode != "pipelined")


def test_begin_block_on_leaf_and_non_leaf_modules_with_auto_ids():
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 3)))
    BeginBlock(model[0], ipu_id=0)
    BeginBlock(model[1], ipu_id=1)
    x = torch.randn(2, 3)
    assert uses_blocks(model, None, (x,))
    program = compile_program(model, _options(di=2), (x,), {}, False)
    assert [(s.ipu, s.blocks) for s in program.stages] == [(0, ("0",)), (1, ("1",))]
    assert program.meta["block_map"] == {"0": {"stage": 0, "ipu": 0}, "1": {"stage": 1, "ipu": 1}}
    values, _ = _forward(program, [x])
    torch.testing.assert_close(values[program.output_names[0]], model(x))


class EveryAnnotation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = BeginBlock(nn.Linear(3, 3), "Bb", ipu_id=1)
        self.c = nn.Linear(3, 3)
        self.twice = BeginBlock(lambda t: t * 2, "Bd", ipu_id=3)

    def forward(self, x):
        Block.useAutoId()
        with Block(ipu_id=0):
            x = self.a(x)
        x = self.b(x).relu()  # BeginBlock has no end: relu stays in Bb
        x = self.tail(x)
        return self.twice(x)

    @BlockFunction("Bc", ipu_id=2)
    def tail(self, x):
        return self.c(x)


def test_every_annotation_kind_compiles():
    model = EveryAnnotation()
    x = torch.randn(2, 3)
    program = compile_program(model, _options(di=4), (x,), {}, False)
    assert [(s.ipu, s.blocks) for s in program.stages] == [
        (0, ("0",)),
        (1, ("Bb",)),
        (2, ("Bc",)),
        (3, ("Bd",)),
    ]
    assert "relu" in program.stages[1].outputs
    values, _ = _forward(program, [x])
    torch.testing.assert_close(values[program.output_names[0]], model(x))


def test_forward_sees_running_on_ipu_and_kwargs_are_inputs():
    seen = []

    class Probe(nn.Module):
        def forward(self, x, scale=1.0, *, bias=None):
            seen.append(isRunningOnIpu())
            with Block("A", ipu_id=0):
                y = x * scale
            with Block("B", ipu_id=1):
                return y + bias

    x, bias = torch.randn(2), torch.randn(2)
    program = compile_program(Probe(), _options(di=2), (x, 3.0), {"bias": bias}, False)
    assert seen == [True] and program.input_names == ("x", "bias")
    values, _ = _forward(program, [x, bias])
    torch.testing.assert_close(values[program.output_names[0]], x * 3.0 + bias)


def test_non_tensor_values_crossing_stages_are_reported():
    class Sizes(nn.Module):
        def forward(self, x):
            n = x.size(0)
            width = x.shape[1] * x.shape[2]
            with Block("A", ipu_id=0):
                y = x * 2
            with Block("B", ipu_id=1):
                return y.reshape(n, width) + n

    program = compile_program(Sizes(), _options(di=2), (torch.randn(2, 3, 2),), {}, False)
    non_tensors = program.meta["non_tensor_values"]
    assert {"size", "mul"} <= non_tensors and not non_tensors & {"x", "mul_1", "reshape", "add"}
    assert {"size", "mul"} <= set(program.stages[1].inputs)


def test_compiling_does_not_touch_buffers():
    class Norm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            with Block("A", ipu_id=0):
                return self.bn(x)

    model = Norm().train()
    state = copy.deepcopy(model.state_dict())
    compile_program(model, _options(), (torch.randn(4, 3),), {}, False)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name], msg=name)


def test_models_without_blocks_do_not_need_the_compiler():
    class Untraceable(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    x = torch.randn(2)
    assert not uses_blocks(nn.Linear(2, 2), None, (x,))
    assert not uses_blocks(Untraceable(), None, (x,))


def test_describe_lists_every_stage():
    model = WithLoss(TutorialNet())
    args = (torch.randn(2, 1, 28, 28), torch.randint(0, 10, (2,)))
    text = describe(
        compile_program(model, _options(ga=7, strategy=TUTORIAL_STAGES), args, {}, True)
    )
    assert text.count("StageSpec(") == 4 and "loss loss" in text


# ---- PopTorch's errors ------------------------------------------------------------------------


def test_op_after_a_closed_block():
    class Missing(nn.Module):
        def forward(self, x):
            with Block("A", ipu_id=0):
                x = x + 1
            return x * 2

    with pytest.raises(
        Error, match="No active Block, all the ops must belong to a Block.*x \\* 2"
    ):
        compile_program(Missing(), _options(), (torch.ones(1),), {}, False)


def test_nested_block_exit_leaves_no_active_block_but_start_has_no_end():
    class Nested(nn.Module):
        def __init__(self, use_start: bool) -> None:
            super().__init__()
            self.use_start = use_start

        def forward(self, x):
            if self.use_start:
                Block.start("A", ipu_id=0)
                x = x + 1
                Block.start("B", ipu_id=1)
                return x * 3
            with Block("A", ipu_id=0):
                with Block("B", ipu_id=1):
                    x = x + 1
                return x * 3

    x = torch.ones(2)
    with pytest.raises(Error, match="No active Block.*after block 'B' ended.*return x \\* 3"):
        compile_program(Nested(False), _options(di=2), (x,), {}, False)
    program = compile_program(Nested(True), _options(di=2), (x,), {}, False)
    assert [(s.ipu, s.blocks) for s in program.stages] == [(0, ("A",)), (1, ("B",))]


def test_data_dependent_control_flow_is_a_clear_error():
    class DataDependent(nn.Module):
        def forward(self, x):
            with Block("A", ipu_id=0):
                x = x + 1
                if x.sum() > 0:
                    x = x * 2
            return x

    with pytest.raises(TraceFailure, match=r"(?s)test_compiler.py:\d+.*if x.sum\(\) > 0"):
        compile_program(DataDependent(), _options(), (torch.ones(2),), {}, False)
    with pytest.raises(TraceFailure, match="cannot trace DataDependent.forward"):
        uses_blocks(DataDependent(), None, (torch.ones(2),))


def test_unknown_block_and_missing_ipu():
    x = torch.randn(2, 3)
    with pytest.raises(
        AssertionError, match="Unknown Block 'B' list of expected Blocks: \\['A'\\]"
    ):
        compile_program(
            Chain([("A", 0), ("B", 1)]),
            _options(di=2, strategy=PipelinedExecution("A")),
            (x,),
            {},
            False,
        )
    with pytest.raises(AssertionError, match="no IPU was specified for block B"):
        compile_program(Chain([("A", 0), ("B", None)]), _options(di=2), (x,), {}, False)


def test_pipeline_depth_training():
    model = WithLoss(TutorialNet())
    args = (torch.randn(2, 1, 28, 28), torch.randint(0, 10, (2,)))
    message = (
        r"poptorch.Options\(\).Training.gradientAccumulation must be greater than or equal to "
        r"the number of pipeline stages \(7\) when using poptorch.PipelinedExecution. Please note "
        r"that a model with 4 pipeline stages in PopTorch will have an additional 3 stages when "
        r"training."
    )
    with pytest.raises(Error, match=message):
        compile_program(model, _options(ga=6, strategy=TUTORIAL_STAGES), args, {}, True)
    sharded = ShardedExecution(*(Stage(f"B{i + 1}").ipu(i) for i in range(4)))
    compile_program(model, _options(ga=1, strategy=sharded), args, {}, True)


def test_pipeline_depth_inference():
    message = (
        r"poptorch.Options\(\).deviceIterations must be greater than or equal to the number of "
        r"pipeline stages \(4\) when using PopTorch.PipelinedExecution."
    )
    with pytest.raises(Error, match=message):
        compile_program(
            TutorialNet(),
            _options(di=3, strategy=TUTORIAL_STAGES),
            (torch.randn(1, 1, 28, 28),),
            {},
            False,
        )


def test_ipu_count_rules():
    model = Chain([("A", 0), ("B", 1), ("C", 2)])
    x = torch.randn(2, 3)
    message = (
        "The model specifies the use of 3 IPUs, however PopTorch must reserve a minimum of 4 in "
        "order to allow the model to run, because PopTorch must reserve a power of 2 or maximum "
        r"of 64 IPUs per process. Please reconfigure your model to use a different number of "
        r"IPUs or set poptorch.Options\(\).autoRoundNumIPUs\(True\)."
    )
    with pytest.raises(Error, match=message):
        compile_program(model, _options(di=3, auto_round=False), (x,), {}, False)
    program = compile_program(model, _options(di=3), (x,), {}, False)
    assert program.meta["num_ipus"] == 4 and program.num_ipus == 3
    big = _options(di=3, replicas=32)
    with pytest.raises(Error, match=r"Too many IPUs requested \(96\). Experiments that need more"):
        compile_program(model, big, (x,), {}, False)


def test_ipu_count_is_checked_before_the_pipeline_depth_and_not_rounded_offline():
    model = Chain([("A", 0), ("B", 1), ("C", 2)])
    x = torch.randn(2, 3)
    # Three stages with deviceIterations 1 is also too shallow: PopTorch acquires the device
    # (and rounds its IPU count) first, so the IPU count is what it reports.
    with pytest.raises(Error, match="The model specifies the use of 3 IPUs") as caught:
        compile_program(model, _options(di=1, auto_round=False), (x,), {}, False)
    # Raised by PopTorch's C++ compiler: the type is part of the text, not of .message.
    assert str(caught.value).startswith("'poptorch_cpp_error': The model specifies")
    assert caught.value.message.startswith("The model specifies")
    assert caught.value.type == "poptorch_cpp_error"
    offline = _options(di=3, auto_round=False).useOfflineIpuTarget()
    assert compile_program(model, offline, (x,), {}, False).meta["num_ipus"] == 3
    replicas = poptorch_sim.Options().replicationFactor(128)
    model_128 = poptorch_sim.inferenceModel(nn.Linear(3, 3), replicas)
    with pytest.raises(Error, match=r"Too many IPUs requested \(128\)"):  # before the machine
        model_128(torch.randn(128, 3))
    far = Chain([("A", 0), ("B", 200)])
    with pytest.raises(Error, match=r"Too many IPUs requested \(201\)"):
        compile_program(far, _options(di=1), (x,), {}, False)


def test_parallel_phases_parity():
    model = Chain([("A", None), ("B", None)])
    strategy = ParallelPhasedExecution(Phase(Stage("A").ipu(0)), Phase(Stage("B").ipu(2)))
    with pytest.raises(
        Error, match="even phases must run on even IPUs and odd phases on odd IPUs"
    ):
        compile_program(model, _options(strategy=strategy), (torch.randn(2, 3),), {}, False)
    strategy.phase(1).ipus(1)
    program = compile_program(model, _options(strategy=strategy), (torch.randn(2, 3),), {}, False)
    assert [s.ipu for s in program.stages] == [0, 1] and program.sharded


class Losses(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(3, 3)

    def forward(self, x, y):
        with Block("A", ipu_id=0):
            out = self.lin(x)
        with Block("B", ipu_id=1):
            if self.kind == "none":
                return out.sum()
            l1 = F.mse_loss(out, y)
            l2 = nn.L1Loss()(out, y) if self.kind == "two" else None
            if self.kind == "two":
                return l1 + l2
            if self.kind == "wrapped":
                return loss_ops.identity_loss(l1 + F.l1_loss(out, y), reduction="sum")
            return identity_loss(l1 * 3, "mean"), l1


def test_no_loss_and_multiple_losses():
    args = (torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(Error, match="Couldn't find a loss in graph!"):
        compile_program(Losses("none"), _options(ga=3), args, {}, True)
    with pytest.raises(Error, match="Multiple independent losses found in graph. Graph must have"):
        compile_program(Losses("two"), _options(ga=3), args, {}, True)


@pytest.mark.parametrize("kind", ["wrapped", "demoted"])
def test_identity_loss_is_the_final_loss(kind):
    args = (torch.randn(2, 3), torch.randn(2, 3))
    program = _check_training(Losses(kind), args, _options(ga=3), loss_of=lambda out: out[0])
    assert program.loss_name.startswith("identity_loss")


# ---- tuple results and phases ------------------------------------------------------------------


class SplitThenIndex(nn.Module):
    """``torch.split`` in block A; its pieces are picked after A ended and used in B."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        with Block("A", ipu_id=0):
            halves = torch.split(self.a(x), 2)
            top, low = x.max(dim=1)
        first = halves[0]  # indexing a tuple: no op in PopTorch, so no "No active Block" error
        with Block("B", ipu_id=1):
            out = self.b(first + halves[1]) * top.unsqueeze(1)[:2]
            return out, identity_loss(out.sum() + low.float().sum(), "sum")


def test_indexing_a_tuple_result_goes_with_the_op_that_made_it():
    program = _check_training(SplitThenIndex(), (torch.randn(4, 4),), _options(ga=3))
    picks = [  # the index of every getitem of each stage: ints pick from tuples
        [type(n.args[1]) for n in stage.module.graph.nodes if n.target is operator.getitem]
        for stage in program.stages
    ]
    assert picks == [[int] * 4, [slice]]  # halves[0], halves[1], top, low | the [:2] of a tensor
    assert [(s.ipu, s.blocks) for s in program.stages] == [(0, ("A",)), (1, ("B",))]


def test_indexing_a_tensor_after_its_block_ended_is_still_an_error():
    class TensorIndex(nn.Module):
        def forward(self, x):
            with Block("A", ipu_id=0):
                y = x * 2
            z = y[0]
            with Block("B", ipu_id=1):
                return z + 1

    with pytest.raises(Error, match="No active Block.*op 'getitem' runs after block 'A' ended"):
        compile_program(TensorIndex(), _options(di=2), (torch.ones(2, 2),), {}, False)


class CrossingPhase(nn.Module):
    """In phase 1, IPU 1 uses a value of IPU 3 and IPU 3 one of IPU 1 (both ways)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.ParameterList(nn.Parameter(torch.randn(3, 3)) for _ in range(5))

    def forward(self, x):
        with Block("p0", ipu_id=0):
            a = torch.relu(self.w[0] @ x)
        with Block("i1", ipu_id=1):
            b = torch.relu(self.w[1] @ a)
        with Block("i3", ipu_id=3):
            c = torch.relu(self.w[2] @ b)
        with Block("i1b", ipu_id=1):
            d = torch.relu(self.w[3] @ c)
        with Block("i3b", ipu_id=3):
            e = self.w[4] @ (d + c)
            return e, identity_loss(e, "mean")


def test_values_may_flow_both_ways_between_the_ipus_of_one_phase():
    strategy = ParallelPhasedExecution(
        Phase(Stage("p0").ipu(0)), Phase(Stage("i1", "i1b").ipu(1), Stage("i3", "i3b").ipu(3))
    )
    program = _check_training(CrossingPhase(), (torch.randn(3, 2),), _options(strategy=strategy))
    assert [s.ipu for s in program.stages] == [0, 1, 3, 1, 3]


def test_any_failure_of_the_symbolic_trace_is_a_trace_failure():
    # As in Hugging Face's BERT: a buffer sliced with a size, which fx only has as a proxy.
    class SliceBySize(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("positions", torch.arange(16).float())

        def forward(self, x):
            with Block("A", ipu_id=0):
                return x + self.positions[: x.size(0)]

    with pytest.raises(TraceFailure, match=r"(?s)TypeError: slice indices.*positions\[: x.size"):
        trace_model(SliceBySize(), (torch.ones(4),), {})
    # The compiler then captures it with torch.export (tests/test_capture.py).
    program = compile_program(SliceBySize(), _options(), (torch.ones(4),), {}, False)
    assert program.meta["capture"] == "torch.export"
