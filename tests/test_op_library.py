"""``torch.ops.poptorch``: PopTorch's op library with its schemas, each op against a plain
reference, and a model calling the ops directly split over IPUs like ``poptorch.Block``."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.ops.annotations import current_attributes, current_name_scope
from poptorch_sim.ops.library import SCHEMAS

OPS = torch.ops.poptorch


def test_every_op_has_poptorchs_schema() -> None:
    for name, schema in SCHEMAS.items():
        assert str(getattr(OPS, name).default._schema) == f"poptorch::{name}{schema}"
    assert len(SCHEMAS) == 32


# ---- each op against its reference --------------------------------------------------------


def test_markers_return_their_input_or_nothing() -> None:
    x = torch.randn(3, requires_grad=True)
    for y in (
        OPS.nop(x),
        OPS.recomputation_checkpoint(x),
        OPS.set_available_memory(x, 0.3),
        OPS.set_matmul_serialization(x, "output_channels", 2, False),
        OPS.set_overlap_for_input(x, "OverlapAccumulationLoop"),
        OPS.set_overlap_for_output(x, "NoOverlap"),
    ):
        torch.testing.assert_close(y, x)
        y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 6.0))
    assert OPS.end_for_loop([x], [x], 3)[0] is x  # PopTorch's CPU meaning: the outputs
    assert OPS.end_if_block([x], torch.tensor(True))[0] is x
    assert OPS.end_cpu_op([x])[0] is x
    OPS.begin_ipu_block(0, 0, 0)  # eager: no block recorder listens
    OPS.end_ipu_block()
    OPS.optimizer_group(0, [x])
    OPS.begin_multi_conv()
    OPS.end_multi_conv([0.3], None, None, None, None, None)
    OPS.start_for_loop([x])
    OPS.call_cpu_op([x], "host")


def test_name_scopes_and_attributes_nest_like_poptorchs_context_managers() -> None:
    OPS.push_name_scope("encoder")
    OPS.push_name_scope("layer0")
    assert current_name_scope() == "encoder/layer0"
    OPS.pop_name_scope()
    OPS.pop_name_scope()
    assert current_name_scope() == ""
    OPS.push_name_scope("")  # a scope with an empty name is still a scope of the stack
    OPS.pop_name_scope()
    with pytest.raises(poptorch.Error, match="no name scope is open"):
        OPS.pop_name_scope()
    OPS.set_attribute("__outline", "layer", "embedding")
    assert current_attributes() == {"__outline": {"layer": "embedding"}}
    OPS.clear_attribute("__outline", "layer")
    assert current_attributes() == {}


def test_ipu_print_tensor_prints_as_poptorch_ipu_print_tensor(capfd: pytest.CaptureFixture[str]):
    x = torch.tensor([[1.5, -2.0], [3.25, 4.0]], requires_grad=True)
    y = OPS.ipu_print_tensor(x, "x", 1, 1000, 3, 80, 4, 2, ", ", "[", "]")
    y.sum().backward()
    ours = capfd.readouterr().err
    z = poptorch.ipu_print_tensor(x, "x", True, 1000, 3, 80, 4, "scientific", ", ", "[", "]")
    z.sum().backward()
    assert ours == capfd.readouterr().err
    assert ours.startswith("x: [\n [ 1.500e+00,-2.000e+00]") and "x_gradient: " in ours
    torch.testing.assert_close(y, x)


def _python_slice(values: list[float], start: int, size: int, step: int) -> list[float]:
    return [values[(start + i) % len(values)] for i in range(0, size, step)]


@pytest.mark.parametrize("start,size,step", [(0, 4, 1), (2, 4, 2), (4, 4, 1), (6, 4, 1)])
def test_dynamic_slice_and_update_match_python_indexing(start: int, size: int, step: int):
    values = [float(v) for v in range(8)]
    t = torch.tensor(values)
    got = OPS.dynamic_slice(t, 0, torch.tensor([start], dtype=torch.int32), size, step)
    assert got.tolist() == _python_slice(values, start, size, step)
    if step == 1 and start + size <= 8:
        src = torch.full((size,), -1.0)
        updated = OPS.dynamic_update(t, src, 0, torch.tensor([start]), size)
        expected = values[:start] + [-1.0] * size + values[start + size :]
        assert updated.tolist() == expected


def test_identity_loss_and_internal_cast_use_poptorchs_codes() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    assert OPS.identity_loss(x, 0).item() == 12.0
    assert OPS.identity_loss(x, 1).item() == 3.0
    torch.testing.assert_close(OPS.identity_loss(x, 2), x)
    assert OPS.internal_cast(x, "FLOAT16").dtype == torch.float16
    assert OPS.internal_cast(x.half(), "FLOAT").dtype == torch.float32


def _ctc_exact(probs: list[list[float]], blank: int) -> dict[tuple[int, ...], float]:
    """Every alignment enumerated: the probability of each collapsed labelling."""
    totals: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(len(probs[0])), repeat=len(probs)):
        label = [k for i, k in enumerate(path) if k != blank and (i == 0 or path[i - 1] != k)]
        p = math.prod(probs[t][k] for t, k in enumerate(path))
        totals[tuple(label)] = totals.get(tuple(label), 0.0) + p
    return totals


def test_ctc_beam_search_with_a_wide_beam_finds_the_exact_best_labellings() -> None:
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 2, 3, dtype=torch.float64), -1)
    lengths = torch.tensor([4, 3])
    scores, lens, paths = OPS.ctc_beam_search_decoder(probs.log(), lengths, 0, 100, 2)
    for b in range(2):
        exact = _ctc_exact(probs[: int(lengths[b]), b].tolist(), blank=0)
        best = sorted(exact.items(), key=lambda kv: -kv[1])[:2]
        for k, (label, p) in enumerate(best):
            assert paths[b, k, : lens[b, k]].tolist() == list(label)
            assert math.isclose(math.exp(scores[b, k].item()), p, rel_tol=1e-9)


def _fps_python(points: list[list[float]], ptr: list[int], ratio: float) -> list[int]:
    picked = []
    for lo, hi in zip(ptr[:-1], ptr[1:]):
        seg = list(range(lo, hi))
        chosen = [lo]
        while len(chosen) < math.ceil((hi - lo) * ratio):
            far = max(
                seg,
                key=lambda i: (
                    min(sum((a - b) ** 2 for a, b in zip(points[i], points[j])) for j in chosen),
                    -i,
                ),
            )
            chosen.append(far)
        picked += chosen
    return picked


def test_fps_and_nearest_match_plain_python() -> None:
    torch.manual_seed(1)
    pts = torch.randn(11, 3, dtype=torch.float64)
    ptr = [0, 6, 11]
    assert OPS.fps(pts, ptr, 0.5, False).tolist() == _fps_python(pts.tolist(), ptr, 0.5)
    x, y = torch.randn(7, 2, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    bx, by = [0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1]

    def closest(i: int) -> int:
        same = [j for j in range(5) if by[j] == bx[i]]
        return min(same, key=lambda j: (sum((a - b) ** 2 for a, b in zip(x[i], y[j])), j))

    expected = [closest(i) for i in range(7)]
    assert OPS.nearest_batch_list(x, y, bx, by).tolist() == expected
    assert OPS.nearest(x, y, torch.tensor(bx), torch.tensor(by)).tolist() == expected


# ---- PopTorch's errors ---------------------------------------------------------------------


def test_bad_arguments_get_poptorchs_errors() -> None:
    x = torch.ones(4)
    with pytest.raises(poptorch.Error, match="reduction must be sum \\(0\\), mean \\(1\\)"):
        OPS.identity_loss(x, 3)
    with pytest.raises(ValueError, match="Invalid poptorch.cast target type"):
        OPS.internal_cast(x, "INT8")
    with pytest.raises(poptorch.Error, match="Expected integer typed start tensor"):
        OPS.dynamic_slice(x, 0, torch.tensor([0.0]), 2, 1)
    with pytest.raises(poptorch.Error, match="Incorrect shape for first input to CTC"):
        OPS.ctc_beam_search_decoder(x, torch.tensor([1]), 0, 2, 1)
    with pytest.raises(poptorch.Error, match="no name scope is open"):
        OPS.pop_name_scope()
    with pytest.raises(RuntimeError, match="Expected a value of type 'int'"):
        OPS.begin_ipu_block("B1", 0, 0)


# ---- inside a model split over IPUs --------------------------------------------------------


class DirectOps(nn.Module):
    """Blocks from ``torch.ops.poptorch.begin_ipu_block``, and the other ops on the way."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        OPS.begin_ipu_block(0, 0, 0)
        OPS.push_name_scope("a")
        h = OPS.nop(torch.relu(self.a(x)))
        OPS.pop_name_scope()
        OPS.end_ipu_block()
        OPS.begin_ipu_block(1, 0, 1)
        OPS.set_attribute("__outline", "layer", "b")
        h = OPS.recomputation_checkpoint(OPS.set_available_memory(self.b(h), 0.4))
        OPS.clear_attribute("__outline", "layer")
        h = OPS.dynamic_slice(h, 1, torch.tensor([2]), 4, 1)
        OPS.end_ipu_block()
        OPS.begin_ipu_block(2, 0, 2)
        out = self.c(h)
        loss = OPS.identity_loss(nn.functional.cross_entropy(out, y, reduction="none"), 1)
        OPS.end_ipu_block()
        return out, loss


class WithBlocks(DirectOps):
    """The same model written with ``poptorch.Block``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        with poptorch.Block(ipu_id=0):
            h = torch.relu(self.a(x))
        with poptorch.Block(ipu_id=1):
            h = self.b(h)[:, 2:6]
        with poptorch.Block(ipu_id=2):
            out = self.c(h)
            loss = poptorch.identity_loss(
                nn.functional.cross_entropy(out, y, reduction="none"), "mean"
            )
        return out, loss


def _train(model: nn.Module, capture: str, x: torch.Tensor, y: torch.Tensor):
    opts = (
        poptorch.Options()
        .autoRoundNumIPUs(True)
        .setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    )
    opts.Jit.captureMethod(capture)
    opts.Training.gradientAccumulation(6)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    out, loss = training(x, y)
    program = training._executable.program.program
    placement = [s.ipu for s in program.stages], program.meta["capture"]
    training.copyWeightsToHost()
    training.destroy()
    return out, loss, placement


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_direct_ops_split_and_train_like_blocks_and_eager(capture: str) -> None:
    torch.manual_seed(0)
    direct = DirectOps()
    blocks = WithBlocks()
    blocks.load_state_dict(direct.state_dict())
    reference = copy.deepcopy(direct)
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    out, loss, placement = _train(direct, capture, x, y)
    b_out, b_loss, b_placement = _train(blocks, capture, x, y)
    assert placement == b_placement == ([0, 1, 2], f"torch.{capture}")
    (outs,) = train_reference(
        reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, y), 1, 6, 1
    )
    torch.testing.assert_close(out, torch.cat([o[0][0] for o in outs]))
    torch.testing.assert_close(loss, torch.stack([o[0][1] for o in outs]))
    torch.testing.assert_close(out, b_out)
    torch.testing.assert_close(loss, b_loss)
    for name, param in reference.named_parameters():
        torch.testing.assert_close(direct.get_parameter(name), param, msg=name)
        torch.testing.assert_close(blocks.get_parameter(name), param, msg=name)


def test_custom_operation_runs_the_registered_implementation() -> None:
    poptorch.register_custom_op("CubePlus", "model_garden", lambda x: x**3 + 1)
    x = torch.tensor([1.0, 2.0])
    (y,) = OPS.custom_operation([x], "CubePlus", "model_garden", 1, 1, [x], "")
    assert y.tolist() == [2.0, 9.0]
    with pytest.raises(poptorch.Error, match="no implementation of the custom op 'Nope'"):
        OPS.custom_operation([x], "Nope", "model_garden", 1, 1, [x], "")


class Printing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = OPS.ipu_print_tensor(self.lin(x), "h", 0, 1000, 3, 80, 4, 0, ", ", "(", ")")
        return h.sum()


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_ipu_print_tensor_prints_each_micro_batch_when_the_program_runs(capture, capfd) -> None:
    opts = poptorch.Options().deviceIterations(3)
    opts.Jit.captureMethod(capture)
    model = poptorch.inferenceModel(Printing(), opts)
    model(torch.ones(3, 2))
    assert capfd.readouterr().err.count("h: (") == 3  # not at capture time, once per run
    model(torch.ones(3, 2))
    assert capfd.readouterr().err.count("h: (") == 3
    model.destroy()
