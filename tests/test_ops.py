"""PopTorch's ops against their eager PyTorch references: values, gradients, messages."""

from __future__ import annotations

import copy
import itertools
import math
import re
from unittest import mock

import pytest
import torch
import torch.fx

import poptorch_sim as poptorch
from poptorch_sim import testing
from poptorch_sim.enums import MatMulSerializationMode, MultiConvPlanType, OverlapMode
from poptorch_sim.errors import Error
from poptorch_sim.ops import annotations, control, custom, misc, printing, slicing
from poptorch_sim.ops.annotations import (
    Attribute,
    NameScope,
    current_attributes,
    current_name_scope,
    nop,
    recomputationCheckpoint,
    serializedMatMul,
    set_available_memory,
    set_overlap_for_input,
    set_overlap_for_output,
)
from poptorch_sim.ops.control import cond, for_loop, training_graph
from poptorch_sim.ops.cpu import CPU
from poptorch_sim.ops.custom import custom_op, register_custom_op, unregister_custom_op
from poptorch_sim.ops.misc import ctc_beam_search_decoder, fps, nearest
from poptorch_sim.ops.multiconv import MultiConv
from poptorch_sim.ops.printing import PrintFormat, format_tensor, ipu_print_tensor
from poptorch_sim.ops.slicing import dynamic_slice, dynamic_update
from poptorch_sim.profiling import Channel


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# --------------------------------------------------------------------------- ipu_print_tensor

# PopTorch's tests/ipu_print_tensor_test.py cases (torch.manual_seed(0); torch.rand(2, 2) + 1).
POPLAR_CASES = [
    pytest.param(
        (1000, 3, 75, 8, "auto", " ", "{", "}"),
        "title: {\n {1.4962566 1.7682219}\n {1.0884774 1.1320305}\n}",
        id="auto-curly-space",
    ),
    pytest.param(
        (500, 2, 15, 8, "scientific", ",", "[", "]"),
        "title: [\n [1.4962566e+00,\n   1.7682219e+00]\n [1.0884774e+00,\n   1.1320305e+00]\n]",
        id="scientific-square-wrapped",
    ),
    pytest.param(
        (1500, 1, 125, 8, "fixed", ";", "(", ")"),
        "title: (\n (1.4962566;1.7682219)\n (1.0884774;1.1320305)\n)",
        id="fixed-parentheses-semicolon",
    ),
]


@pytest.mark.parametrize(("options", "expected"), POPLAR_CASES)
def test_print_matches_poplar_format(capfd, options, expected):
    x = torch.rand((2, 2)) + 1
    out = ipu_print_tensor(x, "title", True, *options)
    assert expected in capfd.readouterr().err
    torch.testing.assert_close(out, x)


FORMAT_CASES = [
    pytest.param(torch.tensor([1.0, 2.0]), {}, "(1.000,2.000)", id="defaults"),
    pytest.param(torch.tensor(2.5), {}, "2.500", id="scalar"),
    pytest.param(torch.tensor([1.5, -2.0]), {"separator": " "}, "( 1.500 -2.000)", id="aligned"),
    pytest.param(torch.tensor([123.25, 1.5]), {}, "(123.2,  1.5)", id="fixed-int-digits"),
    pytest.param(torch.tensor([1e-6, 1.0]), {}, "(1.000e-06,1.000e+00)", id="auto-scientific"),
    pytest.param(torch.tensor([3, -12, 7]), {}, "(  3,-12,  7)", id="int"),
    pytest.param(torch.tensor([True, False]), {}, "( true,false)", id="bool"),
    pytest.param(torch.tensor([True, True]), {}, "(true,true)", id="bool-all-true"),
    pytest.param(torch.tensor([0.5, -1.25]), {"digits": 0}, "(0.5,-1.25)", id="digits0"),
    pytest.param(
        torch.tensor([0.5, 12345.0]), {"float_format": "none"}, "(      0.5,1.234e+04)", id="none"
    ),
    pytest.param(torch.tensor([float("nan"), 1.0]), {}, "(  nan,1.000)", id="nan"),
    pytest.param(
        torch.arange(10),
        {"summarise_threshold": 5, "edge_items": 2},
        "(0,1,...,8,9)",
        id="summarised-1d",
    ),  # fmt: skip
    pytest.param(
        torch.arange(16).reshape(8, 2),
        {"summarise_threshold": 4, "edge_items": 1},
        "(\n ( 0, 1)\n ...\n (14,15)\n)",
        id="summarised-2d",
    ),
    pytest.param(
        torch.arange(10), {"summarise_threshold": 0}, "(0,1,2,3,4,5,6,7,8,9)", id="never-summarise"
    ),  # fmt: skip
    pytest.param(
        torch.arange(8).reshape(2, 2, 2),
        {"separator": " "},
        "(\n (\n  (0 1)\n  (2 3)\n )\n (\n  (4 5)\n  (6 7)\n )\n)",
        id="rank3",
    ),
    pytest.param(
        torch.arange(10, 16),
        {"max_line_width": 10, "separator": " "},
        "(10 11 12\n  13 14\n  15)",
        id="wrapped-1d",
    ),
    pytest.param(
        torch.arange(10, 16), {"max_line_width": 0}, "(10,11,12,13,14,15)", id="never-wrap"
    ),  # fmt: skip
    pytest.param(torch.zeros(0), {}, "()", id="empty"),
]


@pytest.mark.parametrize(("tensor", "options", "expected"), FORMAT_CASES)
def test_format_tensor(tensor, options, expected):
    assert format_tensor(tensor, PrintFormat(**options)) == expected


def test_print_uses_first_character_of_separator_and_brackets(capfd):
    ipu_print_tensor(torch.tensor([1, 2]), "x", separator=";;", open_bracket="<<")
    assert "x: <1;2)\n" in capfd.readouterr().err


def test_print_without_title_uses_a_stand_in_name(capfd):
    ipu_print_tensor(torch.tensor([1, 2]))
    assert "ipu_print_tensor: (1,2)" in capfd.readouterr().err


def test_print_is_identity_and_prints_the_gradient(capsys):
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = ipu_print_tensor(x, "a")
    (y * torch.tensor([3.0, 4.0])).sum().backward()
    err = capsys.readouterr().err
    assert err == "a: (1.000,2.000)\na_gradient: (3.000,4.000)\n"
    torch.testing.assert_close(x.grad, torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(y, x)


def test_print_gradient_off_prints_forward_only(capsys):
    x = torch.ones(2, requires_grad=True)
    ipu_print_tensor(x, "a", print_gradient=False).sum().backward()
    assert capsys.readouterr().err == "a: (1.000,1.000)\n"
    torch.testing.assert_close(x.grad, torch.ones(2))


def test_prints_suppressed_silences_forward_and_gradient(capsys):
    x = torch.ones(2, requires_grad=True)
    with printing.prints_suppressed():
        ipu_print_tensor(x, "a").sum().backward()
    assert capsys.readouterr().err == ""
    ipu_print_tensor(x, "a")
    assert capsys.readouterr().err == "a: (1.000,1.000)\n"


def test_print_rejects_non_tensor():
    msg = "ipu print tensor must take a torch.tensor argument. <class 'list'> is not supported."
    with pytest.raises(Error, match=re.escape(msg)):
        ipu_print_tensor([1.0])


def test_print_rejects_unknown_float_format():
    with pytest.raises(KeyError, match="float_format"):
        ipu_print_tensor(torch.ones(1), float_format="engineering")


def test_print_traces_as_one_node_and_prints_when_run(capsys):
    def f(x):
        return ipu_print_tensor(x * 2, "t") + 1

    gm = torch.fx.symbolic_trace(f)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ipu_print_tensor in targets
    assert capsys.readouterr().err == ""
    torch.testing.assert_close(gm(torch.ones(2)), torch.full((2,), 3.0))
    assert capsys.readouterr().err == "t: (2.000,2.000)\n"


# --------------------------------------------------------------------------- for_loop / cond


def test_for_loop_matches_eager_loop():
    def body(x, y, z, w):
        return x * y, y + z, x * w, w + 1

    inputs = [torch.tensor([0.1]), torch.tensor([0.2]), torch.tensor([0.3]), torch.tensor([0.4])]
    out = for_loop(10, body, inputs)
    x, y, z, w = (t.clone() for t in inputs)
    for _ in range(10):
        x, y, z, w = body(x, y, z, w)
    assert isinstance(out, list)
    for got, want in zip(out, [x, y, z, w]):
        torch.testing.assert_close(got, want)


def test_for_loop_passes_inputs_by_value():
    def body(y):
        y += 1
        return y

    x = torch.ones(1, 5, dtype=torch.int32)
    out = for_loop(3, body, [x])[0]
    torch.testing.assert_close(x, torch.ones(1, 5, dtype=torch.int32))
    torch.testing.assert_close(out, torch.full((1, 5), 4, dtype=torch.int32))


def test_for_loop_is_differentiable():
    w = torch.tensor([1.5], requires_grad=True)
    out = for_loop(3, lambda x: x * w, [torch.tensor([2.0])])[0]
    out.backward()
    torch.testing.assert_close(w.grad, torch.tensor([3 * 2.0 * 1.5**2]))


@pytest.mark.parametrize(
    ("inputs", "msg"),
    [
        pytest.param(torch.ones(1), "(Object is not list)", id="not-list"),
        pytest.param(
            [torch.ones(1), 5], "(Object contained in list at index 1 is not torch.tensor)",
            id="not-tensor",
        ),
    ],
)  # fmt: skip
def test_for_loop_input_errors(inputs, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        for_loop(2, lambda x: x, inputs)


def test_for_loop_body_must_keep_arity():
    with pytest.raises(Error, match="takes 1 tensor"):
        for_loop(2, lambda x: (x, x), [torch.ones(1)])


@pytest.mark.parametrize("count", [-1, 2.0, True], ids=["negative", "float", "bool"])
def test_for_loop_count_must_be_a_natural_number(count):
    with pytest.raises(Error, match="count must be a non-negative int"):
        for_loop(count, lambda x: x, [torch.ones(1)])


def test_for_loop_zero_iterations_returns_copies():
    x = torch.ones(2)
    out = for_loop(0, lambda v: v + 1, [x])
    torch.testing.assert_close(out, [x])
    assert out[0] is not x


def test_control_flow_in_training_graph_errors():
    with training_graph():
        assert control.is_training_graph()
        with pytest.raises(Error, match=r"poptorch.for_loop\(\) is only supported in inference"):
            for_loop(2, lambda x: x, [torch.ones(1)])
        with pytest.raises(Error, match=r"poptorch.cond\(\) is only supported in inference"):
            cond(torch.tensor(True), lambda: torch.ones(1), [], lambda: torch.zeros(1), [])
        with training_graph(False):
            assert not control.is_training_graph()
    assert not control.is_training_graph()


@pytest.mark.parametrize("flag", [True, False], ids=["then", "else"])
def test_cond_runs_the_chosen_branch(flag):
    x = torch.tensor([2.0])
    out = cond(torch.tensor(flag), lambda a: a * 3, [x], lambda a: (a - 1, a), [x])
    assert out == ([x * 3] if flag else [x - 1, x])


def test_cond_requires_lists():
    with pytest.raises(ValueError, match=re.escape("to be a list of tensors. (Object is not")):
        cond(torch.tensor(True), lambda a: a, (torch.ones(1),), lambda a: a, [torch.ones(1)])


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_traced_cond_and_loop_match_eager(sign):
    def f(x):
        y = for_loop(2, lambda v: v * 2, [x])[0]
        return cond(y.sum() > 0, lambda v: v + 1, [y], lambda v: v - 1, [y])[0]

    gm = torch.fx.symbolic_trace(f)
    x = torch.ones(3) * sign
    torch.testing.assert_close(gm(x), f(x))


# --------------------------------------------------------------------------- annotations


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(nop, id="nop"),
        pytest.param(lambda t: set_available_memory(t, 0.3), id="set_available_memory"),
        pytest.param(recomputationCheckpoint, id="recomputationCheckpoint"),
        pytest.param(lambda t: set_overlap_for_input(t, OverlapMode.NoOverlap), id="overlap-in"),
        pytest.param(lambda t: set_overlap_for_output(t, OverlapMode.NoOverlap), id="overlap-out"),
    ],
)
def test_identity_ops_values_and_gradients(op):
    x = torch.randn(3, requires_grad=True)
    (op(x * 2) ** 2).sum().backward()
    ref = x.detach().clone().requires_grad_()
    ((ref * 2) ** 2).sum().backward()
    torch.testing.assert_close(op(x), x)
    torch.testing.assert_close(x.grad, ref.grad)


@pytest.mark.parametrize(
    ("call", "exc", "msg"),
    [
        pytest.param(lambda: nop(1), Error, "nop must take a torch.tensor argument", id="nop"),
        pytest.param(lambda: set_available_memory(1, 0.5), Error,
                     "You may only set available memory for torch.tensor values", id="mem-type"),
        pytest.param(lambda: set_available_memory(torch.ones(1), 0.0), Error,
                     r"must be a number in \(0, 1\]; got 0.0", id="mem-zero"),
        pytest.param(lambda: set_available_memory(torch.ones(1), 1.5), Error,
                     r"\(0, 1\]; got 1.5", id="mem-high"),
        pytest.param(lambda: recomputationCheckpoint(torch.ones(1), 2), ValueError,
                     "All inputs must be tensors", id="checkpoint"),
        pytest.param(lambda: set_overlap_for_input(torch.ones(1), "no_overlap"), Error,
                     "expects a poptorch.OverlapMode", id="overlap-mode"),
        pytest.param(lambda: NameScope(3), AssertionError,
                     "Parameter to NameScope must be a string", id="namescope"),
        pytest.param(lambda: Attribute(__outline="layer"), AttributeError,
                     "expects a dictionary", id="attribute"),
    ],
)  # fmt: skip
def test_annotation_errors(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_set_available_memory_accepts_one():
    torch.testing.assert_close(set_available_memory(torch.ones(1), 1.0), torch.ones(1))


def test_recomputation_checkpoint_containers():
    a, b = torch.ones(1), torch.zeros(1)
    assert recomputationCheckpoint(a) is a
    assert recomputationCheckpoint(a, b) == (a, b)
    assert recomputationCheckpoint([a, b]) == [a, b]
    assert isinstance(recomputationCheckpoint((a, b)), tuple)


@pytest.mark.parametrize("mode", list(MatMulSerializationMode), ids=lambda m: m.name)
def test_serialized_matmul_is_matmul(mode):
    lhs = torch.randn(4, 6, requires_grad=True)
    rhs = torch.randn(6, 8, requires_grad=True)
    out = serializedMatMul(lhs, rhs, mode, 2)
    out.sum().backward()
    ref_l, ref_r = lhs.detach().requires_grad_(), rhs.detach().requires_grad_()
    ref = torch.matmul(ref_l, ref_r)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lhs.grad, ref_l.grad)
    torch.testing.assert_close(rhs.grad, ref_r.grad)


@pytest.mark.parametrize(
    ("kwargs", "exc", "msg"),
    [
        pytest.param({"mode": "reducing_dim"}, AssertionError, "MatMulSerializationMode",
                     id="mode"),
        pytest.param({"factor": 2.0}, AssertionError, "factor must be an int", id="factor-type"),
        pytest.param({"keep_precision": 1}, AssertionError, "keep_precision", id="precision"),
        pytest.param({"factor": 4}, Error, r"factor \(4\) must be a factor of the reducing "
                     r"dimension \(6\)", id="factor-divides"),
    ],
)  # fmt: skip
def test_serialized_matmul_errors(kwargs, exc, msg):
    args = {"mode": MatMulSerializationMode.ReducingDim, "factor": 2, **kwargs}
    with pytest.raises(exc, match=msg):
        serializedMatMul(torch.ones(4, 6), torch.ones(6, 8), **args)


def test_overlap_keeps_nested_structure_and_records_requests():
    annotations.overlapped_io_requested()
    data = {"a": (torch.ones(1), [torch.zeros(2)]), "b": torch.ones(3)}
    assert set_overlap_for_input(data, OverlapMode.NoOverlap) is data
    assert not annotations.overlapped_io_requested()
    set_overlap_for_output(data, OverlapMode.OverlapDeviceIterationLoop)
    assert annotations.overlapped_io_requested()
    assert not annotations.overlapped_io_requested()


def test_name_scope_and_attribute_nest_and_restore():
    with NameScope("enc"), NameScope("layer0"):
        assert current_name_scope() == "enc/layer0"
    assert current_name_scope() == ""
    with Attribute(__outline={"layer": "embedding"}):
        with Attribute(__outline={"kind": "x"}, other={"k": 1}):
            assert current_attributes() == {
                "__outline": {"layer": "embedding", "kind": "x"},
                "other": {"k": 1},
            }
        assert current_attributes() == {"__outline": {"layer": "embedding"}}
    assert current_attributes() == {}


# --------------------------------------------------------------------------- MultiConv


def _two_convs(x: torch.Tensor, a: torch.nn.Module, b: torch.nn.Module) -> torch.Tensor:
    return a(x) + b(torch.abs(x))


def test_multiconv_matches_eager_and_chains():
    a, b = torch.nn.Conv2d(1, 4, 3), torch.nn.Conv2d(1, 4, 3)
    x = torch.randn(2, 1, 8, 8)
    mc = (
        MultiConv()
        .availableMemoryProportions((0.8, 0.7))
        .partialsTypes([torch.float, torch.half])
        .planType(MultiConvPlanType.Parallel)
        .perConvReservedTiles(120)
        .cycleBackOff(0.4)
        .enableConvDithering(True)
    )
    assert isinstance(mc, MultiConv)
    with mc:
        out = _two_convs(x, a, b)
    torch.testing.assert_close(out, _two_convs(x, a, b))


@pytest.mark.parametrize(
    ("call", "exc", "msg"),
    [
        pytest.param(lambda m: m.partialsTypes("half"), ValueError, "Invalid partials types",
                     id="partials"),
        pytest.param(lambda m: m.planType("parallel"), AssertionError, "Invalid plan type!",
                     id="plan"),
        pytest.param(lambda m: m.availableMemoryProportions(1), AssertionError,
                     "Invalid available memory proportion!", id="amp"),
        pytest.param(lambda m: m.enableConvDithering([True, 1]), ValueError,
                     "value must be bool or list of bools", id="dithering"),
        pytest.param(lambda m: m.perConvReservedTiles(1.5), AssertionError, "int", id="tiles"),
        pytest.param(lambda m: m.cycleBackOff(1), AssertionError, "float", id="backoff"),
    ],
)  # fmt: skip
def test_multiconv_option_errors(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(MultiConv())


def test_multiconv_scope_errors_and_recovery():
    conv = torch.nn.Conv2d(1, 1, 1)
    x = torch.ones(1, 1, 2, 2)
    with pytest.raises(Error, match="Nested poptorch.MultiConv is not supported"):
        with MultiConv(), MultiConv():
            conv(x)
    with pytest.raises(Error, match="Unexpected end_multi_conv"):
        with MultiConv():
            torch.pow(x, 2)
    with pytest.raises(Error, match="got 3 values but the scope ran 2 convolutions"):
        with MultiConv().partialsTypes([torch.float] * 3):
            conv(conv(x))
    with pytest.raises(RuntimeError, match="boom"):
        with MultiConv():
            raise RuntimeError("boom")
    with MultiConv():  # nothing left active by the failures above
        conv(x)


# --------------------------------------------------------------------------- dynamic slicing


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize(("dim", "start", "size"), [(0, 1, 4), (0, 4, 4), (1, 2, 2)],
                         ids=["d0-s1", "d0-s4", "d1-s2"])  # fmt: skip
def test_dynamic_slice_matches_narrow(dim, start, size, dtype):
    x = torch.randn(8, 4, requires_grad=True)
    out = dynamic_slice(x, dim, torch.tensor([start], dtype=dtype), size, 1)
    out.pow(2).sum().backward()
    ref_x = x.detach().requires_grad_()
    ref = ref_x.narrow(dim, start, size)
    ref.pow(2).sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, ref_x.grad)


@pytest.mark.parametrize("step", [2, 3])
def test_dynamic_slice_with_step(step):
    x = torch.arange(8.0)
    torch.testing.assert_close(dynamic_slice(x, 0, torch.tensor([1]), 4, step), x[1:5:step])


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        pytest.param(([1.0], 0, torch.tensor([0]), 2, 1), "dynamic_slice must take a torch.tensor "
                     "input. <class 'list'> is not supported.", id="input"),
        pytest.param((None, 0.0, torch.tensor([0]), 2, 1), "Dimension must be an integer.",
                     id="dim"),
        pytest.param((None, 0, 0, 2, 1), "Slice start argument to dynamic_slice must be a "
                     "torch.tensor. <class 'int'> is not supported.", id="start"),
        pytest.param((None, 0, torch.tensor([0]), 2.0, 1), "Size must be an integer.", id="size"),
        pytest.param((None, 0, torch.tensor([0]), 2, 1.0), "Step must be an integer.", id="step"),
        pytest.param((None, 0, torch.tensor([0]), 0, 1),
                     "The start and end of a slice must be different.", id="size-zero"),
        pytest.param((None, 0, torch.tensor([0]), -2, 1), "Taking a slice of a tensor with the "
                     "end less than the start is not supported.", id="size-negative"),
        pytest.param((None, 0, torch.tensor([0]), 2, 0), "Slicing step must be at least 1",
                     id="step-zero"),
        pytest.param((None, 0, torch.tensor([1]), 7, 1), "The size of the slice (7) must be a "
                     "factor of the slicing dimension (8).", id="non-factor"),
        pytest.param((None, 0, torch.tensor([1.0]), 2, 1), "Expected integer typed start tensor",
                     id="float-start"),
        pytest.param((None, 2, torch.tensor([0]), 2, 1), "Dimension 2 is out of range",
                     id="dim-range"),
    ],
)  # fmt: skip
def test_dynamic_slice_errors(args, msg):
    args = (torch.arange(8.0) if args[0] is None else args[0], *args[1:])
    with pytest.raises(Error, match=re.escape(msg)):
        dynamic_slice(*args)


@pytest.mark.parametrize(("dim", "start"), [(0, 0), (0, 5), (1, 1)], ids=["d0-0", "d0-5", "d1-1"])
def test_dynamic_update_matches_index_copy(dim, start):
    x = torch.randn(8, 4, requires_grad=True)
    size = 3 if dim == 0 else 2
    src_shape = (size, 4) if dim == 0 else (8, size)
    src = torch.randn(src_shape, requires_grad=True)
    out = dynamic_update(x, src, dim, torch.tensor([start]), size)
    (out * torch.arange(32.0).reshape(8, 4)).sum().backward()
    ref_x, ref_src = x.detach().requires_grad_(), src.detach().requires_grad_()
    index = torch.arange(start, start + size)
    ref = ref_x.index_copy(dim, index, ref_src)
    (ref * torch.arange(32.0).reshape(8, 4)).sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(src.grad, ref_src.grad)
    assert not torch.equal(out, x)  # a new tensor; the input is unchanged


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        pytest.param((1, None, 0, torch.tensor([0]), 2), "dynamic_update must take a "
                     "torch.tensor input. <class 'int'> is not supported.", id="input"),
        pytest.param((None, None, 0, 0, 2), "Slice start argument to dynamic_update must be a "
                     "torch.tensor. <class 'int'> is not supported.", id="start"),
        pytest.param((None, [1.0], 0, torch.tensor([0]), 2), "Src argument to dynamic_update "
                     "must be a torch.tensor. <class 'list'> is not supported.", id="src"),
        pytest.param((None, torch.ones(1, 2), 0, torch.tensor([0]), 2),
                     "input and src tensors must have same dimensionality. (1) vs (2)", id="rank"),
        pytest.param((None, torch.ones(2, dtype=torch.int64), 0, torch.tensor([0]), 2),
                     # named as the IPU holds them: int64 is int32 there
                     "input and src tensor must have same dtype. (torch.float32 vs torch.int32)",
                     id="dtype"),
        pytest.param((None, None, 0, torch.tensor([0]), 0),
                     "The start and end of a slice must be different.", id="size-zero"),
        pytest.param((None, None, 0, torch.tensor([0]), 3),
                     "src is 2 long along dimension 0 but size is 3", id="src-length"),
        pytest.param((None, torch.ones(9), 0, torch.tensor([0]), 9), "the update is 9 long along "
                     "dimension 0 but the input is only 8 long", id="too-long"),
    ],
)  # fmt: skip
def test_dynamic_update_errors(args, msg):
    base = (torch.arange(8.0), torch.ones(2))
    args = tuple(base[i] if i < 2 and a is None else a for i, a in enumerate(args))
    with pytest.raises(Error, match=re.escape(msg)):
        dynamic_update(*args)


@pytest.mark.parametrize("start", [7, 21, -3], ids=["past-end", "far", "negative"])
def test_dynamic_update_out_of_range_start_wraps(start):
    x = torch.arange(8.0, requires_grad=True)
    src = torch.tensor([-1.0, -2.0], requires_grad=True)
    out = dynamic_update(x, src, 0, torch.tensor([start]), 2)
    positions = torch.tensor([start % 8, (start + 1) % 8])
    expected = torch.arange(8.0).index_copy(0, positions, src.detach())
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert src.grad is not None and torch.equal(src.grad, torch.ones(2))
    assert x.grad is not None and x.grad[positions].eq(0).all()


@pytest.mark.parametrize("start", [6, 20, -1], ids=["past-end", "far", "negative"])
def test_dynamic_slice_out_of_range_start_wraps(start):
    x = torch.arange(8.0)
    out = dynamic_slice(x, 0, torch.tensor([start]), 4, 1)
    torch.testing.assert_close(out, x[torch.arange(start, start + 4) % 8])


# --------------------------------------------------------------------------- CPU


def test_cpu_op_single_and_multiple_outputs():
    single = CPU(lambda x, y: x * y, "Mul")
    x, y = torch.randn(2, 3), torch.tensor([2.0])
    torch.testing.assert_close(single(x, y), x * 2)
    assert single.ID == "Mul" and single.in_shapes == [x.shape, y.shape]
    multiple = CPU(lambda x, y: (x * y, x + y), "Two")
    out = multiple(x, y)
    assert isinstance(out, list) and multiple.out_shapes == [x.shape, x.shape]
    torch.testing.assert_close(out[1], x + y)


def test_cpu_op_freezes_a_module():
    layer = torch.nn.Linear(2, 2)
    CPU(layer, "Layer")
    assert not any(p.requires_grad for p in layer.parameters())


# --------------------------------------------------------------------------- custom_op


@pytest.fixture
def cube_op():
    @register_custom_op("Cube", "com.acme")
    def cube(x, bias, scale=1.0):
        return x * x * x * scale, x * bias

    yield cube
    unregister_custom_op("Cube", "com.acme")


def test_custom_op_runs_registered_implementation(cube_op):
    x = torch.full((1, 8), 2.0, requires_grad=True)
    bias = torch.full((1, 8), 4.0)
    out = custom_op([x, bias], "Cube", "com.acme", 1, example_outputs=[x, x])
    torch.testing.assert_close(out, [torch.full((1, 8), 8.0), torch.full((1, 8), 8.0)])
    out[0].sum().backward()
    torch.testing.assert_close(x.grad, 3 * x.detach() ** 2)
    scaled = custom_op([x, bias], "Cube", "com.acme", 1, [x, x], attributes={"scale": 0.5})
    torch.testing.assert_close(scaled[0], torch.full((1, 8), 4.0))
    assert ("Cube", "com.acme") in custom.registered_custom_ops()


def test_custom_op_unregistered_names_the_op_and_the_fix():
    with pytest.raises(Error, match=r"'Missing' \(domain 'my.ops', version 2\).*register_"):
        custom_op([torch.ones(1)], "Missing", "my.ops", 2, [torch.ones(1)])


@pytest.mark.parametrize(
    ("attributes", "exc", "msg"),
    [
        pytest.param({1: 2}, ValueError, "All attribute keys must be strings.", id="key"),
        pytest.param({"a": None}, ValueError, "Attribute values must be floats, ints, strings or "
                     "a list/tuple of float, ints of strings.", id="value"),
        pytest.param({"a": [1, 2.0]}, ValueError,
                     "The types in a list/tuple attribute must all be the same.", id="mixed"),
        pytest.param({"a\u1f00b": 1}, ValueError, "a\u1f00b contains non-ASCII characters.",
                     id="ascii-key"),
        pytest.param({"a": ["x", "a\u1f00b"]}, ValueError,
                     "a\u1f00b contains non-ASCII characters.", id="ascii-value"),
        pytest.param({"a": 1.7976931348623157e308}, Error,
                     "1.79769e+308 is too high for a Popart float attribute.", id="high"),
        pytest.param({"a": [0.0, -1.7976931348623157e308]}, Error,
                     "-1.79769e+308 is too low for a Popart float attribute.", id="low"),
    ],
)  # fmt: skip
def test_custom_op_attribute_errors(cube_op, attributes, exc, msg):
    with pytest.raises(exc, match=re.escape(msg)):
        custom_op([torch.ones(1)], "Cube", "com.acme", 1, [torch.ones(1)], attributes)


def test_custom_op_checks_outputs_against_examples():
    register_custom_op("Sum", "t", lambda x: (x.sum(), x.sum()))
    try:
        with pytest.raises(Error, match="returned 2 output.* example_outputs has 1"):
            custom_op([torch.ones(3)], "Sum", "t", 1, [torch.ones(3)])
        with mock.patch.object(custom.logger, "warning") as warning:
            out = custom_op([torch.ones(3)], "Sum", "t", 1, [torch.ones(3), torch.ones(3)])
        torch.testing.assert_close(out[0], torch.tensor(3.0))
        assert "shape" in warning.call_args[0][0]
    finally:
        unregister_custom_op("Sum", "t")


def test_custom_op_traces_with_one_proxy_per_output(cube_op):
    def f(x):
        a, b = custom_op([x, x], "Cube", "com.acme", 1, example_outputs=[x, x])
        return a - b

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), x**3 - x * x)


# --------------------------------------------------------------------------- CTC, fps, nearest


def _ctc_brute_force(log_probs: torch.Tensor, blank: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every alignment enumerated: the log-probability of each collapsed labelling."""
    time, classes = log_probs.shape
    totals: dict[tuple[int, ...], float] = {}
    for alignment in itertools.product(range(classes), repeat=time):
        score = sum(float(log_probs[t, c]) for t, c in enumerate(alignment))
        merged = [c for i, c in enumerate(alignment) if i == 0 or c != alignment[i - 1]]
        label = tuple(c for c in merged if c != blank)
        previous = totals.get(label, -math.inf)
        top = max(previous, score)
        totals[label] = top + math.log(math.exp(previous - top) + math.exp(score - top))
    return sorted(((s, p) for p, s in totals.items()), key=lambda sp: -sp[0])


@pytest.mark.parametrize("blank", [0, 2])
def test_ctc_beam_search_matches_brute_force(blank):
    log_probs = torch.randn(4, 2, 3).double()
    lengths = torch.tensor([4, 3])
    probs, lens, paths = ctc_beam_search_decoder(log_probs, lengths, blank, 100, 3)
    assert probs.shape == (2, 3) and lens.shape == (2, 3) and paths.shape == (2, 3, 4)
    for b in range(2):
        expected = _ctc_brute_force(log_probs[: int(lengths[b]), b], blank)[:3]
        for k, (score, label) in enumerate(expected):
            assert math.isclose(float(probs[b, k]), score, rel_tol=1e-9)
            assert int(lens[b, k]) == len(label)
            assert tuple(paths[b, k, : len(label)].tolist()) == label


def test_ctc_beam_search_shapes_and_errors():
    out = ctc_beam_search_decoder(torch.randn(9, 3, 10), torch.randint(5, 9, (3,)))
    assert [t.shape for t in out] == [(3, 1), (3, 1), (3, 1, 9)]
    with pytest.raises(Error, match="probs must be a torch.tensor argument"):
        ctc_beam_search_decoder([1.0], torch.ones(1))
    with pytest.raises(Error, match="lengths must be a torch.tensor argument"):
        ctc_beam_search_decoder(torch.ones(2, 1, 2), [2])
    with pytest.raises(Error, match="Incorrect shape for first input"):
        ctc_beam_search_decoder(torch.ones(2, 2), torch.ones(1))


def test_fps_picks_farthest_points_per_segment():
    line = torch.tensor([[0.0], [1.0], [2.0], [10.0], [11.0]])
    torch.testing.assert_close(fps(line, [0, 5], 0.6), torch.tensor([0, 4, 2]))
    two = torch.cat([line, line])
    torch.testing.assert_close(fps(two, [0, 5, 10], 0.6), torch.tensor([0, 4, 2, 5, 9, 7]))
    torch.testing.assert_close(fps(line, [0, 5], 1.0).sort().values, torch.arange(5))
    random = fps(line, [0, 5], 1.0, random_start=True)
    assert sorted(random.tolist()) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        pytest.param(([1.0], [0, 1]), "`fps` must take a torch.tensor input", id="src"),
        pytest.param((None, (0, 1)), "`ptr` must be a list of integers.", id="ptr"),
        pytest.param((None, [0]), "`ptr` must containt at least 2 elements.", id="ptr-short"),
        pytest.param((None, [0, 2], 1), "`ratio` must be of float type.", id="ratio"),
        pytest.param((None, [0, 2], 0.5, 1), "`random_start` must be of bool type.", id="start"),
    ],
)
def test_fps_errors(args, msg):
    args = (torch.ones(2, 2) if args[0] is None else args[0], *args[1:])
    with pytest.raises(Error, match=re.escape(msg)):
        fps(*args)


def _nearest_reference(x, y, bx, by):
    out = []
    for i in range(x.shape[0]):
        best = min(
            (j for j in range(y.shape[0]) if by[j] == bx[i]),
            key=lambda j: (float(((x[i] - y[j]) ** 2).sum()), j),
        )
        out.append(best)
    return torch.tensor(out)


POINTS_X = torch.tensor(
    [[-1, -1], [-1, 1], [1, 1], [1, -1], [-2, -2], [-2, 2], [2, 2], [2, -2]], dtype=torch.float
)
POINTS_Y = torch.tensor([[-1, 0], [1, 0], [-2, 0], [2, 0]], dtype=torch.float)


@pytest.mark.parametrize("as_list", [True, False], ids=["lists", "tensors"])
@pytest.mark.parametrize("dtype", [torch.half, torch.float, torch.double])
def test_nearest_matches_reference(as_list, dtype):
    bx, by = [0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1]
    batch_x, batch_y = (bx, by) if as_list else (torch.tensor(bx), torch.tensor(by))
    x, y = POINTS_X.to(dtype), POINTS_Y.to(dtype)
    expected = _nearest_reference(POINTS_X, POINTS_Y, bx, by)
    torch.testing.assert_close(nearest(x, y, batch_x, batch_y), expected)
    unbatched = _nearest_reference(POINTS_X, POINTS_Y, [0] * 8, [0] * 4)
    torch.testing.assert_close(nearest(x, y), unbatched)


@pytest.mark.parametrize(
    ("bx", "by", "msg"),
    [
        pytest.param([0] * 4 + [1] * 4, [0] * 4, "do not occur", id="missing-y"),
        pytest.param([0] * 4 + [1] * 4, None, "do not occur", id="implicit-y"),
        pytest.param([0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 1, 1], "'batch_x' is not sorted",
                     id="unsorted-x"),
        pytest.param([0] * 4 + [1] * 4, [0, 0, 1, 0], "'batch_y' is not sorted", id="unsorted-y"),
    ],
)  # fmt: skip
def test_nearest_batch_errors(bx, by, msg):
    with pytest.raises(ValueError, match=msg):
        nearest(POINTS_X, POINTS_Y, bx, by)


def test_nearest_type_errors():
    with pytest.raises(Error, match="`nearest` must take a torch.tensor `y` input"):
        nearest(POINTS_X, [1.0])
    with pytest.raises(Error, match="must be torch.Tensors or lists"):
        nearest(POINTS_X, POINTS_Y, (0,) * 8)


# --------------------------------------------------------------------------- testing, profiling


@pytest.mark.parametrize(
    ("ref", "other", "expected"),
    [
        pytest.param(torch.ones(2), torch.ones(2) + 1e-9, True, id="tensor"),
        pytest.param((torch.ones(1), [torch.zeros(1)]), (torch.ones(1), [torch.zeros(1)]), True,
                     id="nested"),
        pytest.param((torch.ones(1),), [torch.ones(1)], False, id="container-type"),
        pytest.param([torch.ones(1)], [torch.ones(1), torch.ones(1)], False, id="length"),
        pytest.param({"a": torch.ones(1)}, {"a": torch.zeros(1)}, False, id="dict-values"),
        pytest.param(torch.ones(1), 1.0, False, id="not-tensor"),
    ],
)  # fmt: skip
def test_testing_allclose(ref, other, expected):
    assert testing.allclose(ref, other) is expected


def test_testing_allclose_rejects_unknown_types():
    with pytest.raises(TypeError, match="got int"):
        testing.allclose(1, 1)


def test_profiling_channel_records_tracepoints_and_instrumented_calls():
    channel = Channel("test_ops_channel")
    channel.clear()

    class Worker:
        def work(self, x):
            return x + 1

    worker = channel.instrument(Worker(), "work")
    with channel.tracepoint("outer"):
        assert worker.work(1) == 2
    names = [s.name for s in Channel("test_ops_channel").spans()]
    assert names == ["test_ops_channel.work", "test_ops_channel.outer"]
    assert all(s.duration_ns >= 0 for s in channel.spans())
    with pytest.raises(AttributeError, match="has no method 'missing'"):
        channel.instrument(worker, "missing")


def test_printing_module_exports():
    assert printing.__all__ == [
        "ipu_print_tensor",
        "PrintFormat",
        "format_tensor",
        "prints_suppressed",
    ]
    assert slicing.__all__ == ["dynamic_slice", "dynamic_update"]
    assert misc.__all__ == ["ctc_beam_search_decoder", "fps", "nearest"]


class FastGather(torch.nn.Module):
    """PopTorch's ``tensor_ops_test.fast_gather_last_dim``, on a trained weight, with a loss."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(9, 11, 6))

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        data = x * self.w
        target = torch.zeros(idx.shape).type_as(data)
        (out,) = custom_op(
            [data, idx], "FastGatherLastDim", "poptorch.custom_ops", 1, example_outputs=[target]
        )
        return out, poptorch.identity_loss((out * out).sum(), "sum")


@pytest.mark.parametrize("width", [6, 3], ids=["same-width", "narrower-index"])
def test_fast_gather_last_dim_is_a_gather_on_the_last_dim(width: int) -> None:
    model = FastGather()
    reference = copy.deepcopy(model)
    x, idx = torch.randn(9, 11, 6), torch.randint(0, 6, (9, 11, width))
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    out, loss = training(x, idx)
    ref = torch.gather(x * reference.w, -1, idx)
    torch.testing.assert_close(out, ref.detach())
    torch.testing.assert_close(loss, (ref * ref).sum().detach())
    (ref * ref).sum().backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    training.copyWeightsToHost()
    torch.testing.assert_close(model.w, reference.w)
    training.destroy()


@pytest.mark.parametrize(
    ("shape", "msg"),
    [((9, 1, 6), "must have same dimensions as Input except for last dim"),
     ((11, 6), "do not have same rank")],
    ids=["other-dim", "rank"],
)  # fmt: skip
def test_fast_gather_last_dim_checks_shapes_as_popart(shape: tuple[int, ...], msg: str) -> None:
    inference = poptorch.inferenceModel(FastGather())
    with pytest.raises(Error, match=msg):
        inference(torch.randn(9, 11, 6), torch.randint(0, 6, shape))
