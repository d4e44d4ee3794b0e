"""The tile-engine NMS against torchvision.ops.nms / batched_nms: identical kept indices."""

from __future__ import annotations

import pytest
import torch
import torchvision

from poptorch_sim import kernels


def _boxes(n: int, clustered: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if clustered:
        centres = torch.rand(n // 40 + 1, 2) * 500
        xy = centres[torch.randint(0, len(centres), (n,))] + torch.randn(n, 2) * 4
    else:
        xy = torch.rand(n, 2) * 1000
    wh = torch.rand(n, 2) * 60 + 0.5
    return torch.cat([xy, xy + wh], dim=1).to(dtype)


def _distinct_scores(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randperm(n).to(torch.float64) / max(n, 1)).to(dtype)


@pytest.mark.parametrize("n", [0, 1, 2, 50, 1000, 3000], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("clustered", [False, True], ids=["random", "clustered"])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.7, 1.0], ids=lambda t: f"iou{t}")
def test_nms_keeps_exactly_what_torchvision_keeps(
    n: int, clustered: bool, threshold: float
) -> None:
    boxes, scores = _boxes(n, clustered), _distinct_scores(n)
    expected = torchvision.ops.nms(boxes, scores, threshold)
    torch.testing.assert_close(kernels.nms(boxes, scores, threshold), expected, rtol=0, atol=0)


def test_nms_float64_and_many_tiles() -> None:
    boxes, scores = _boxes(2000, True, torch.float64), _distinct_scores(2000, torch.float64)
    expected = torchvision.ops.nms(boxes, scores, 0.4)
    with kernels.tiles(1472):
        torch.testing.assert_close(kernels.nms(boxes, scores, 0.4), expected, rtol=0, atol=0)


def test_nms_ties_follow_torchvisions_stable_order() -> None:
    boxes = _boxes(3000, True)
    scores = torch.randint(0, 4, (3000,)).float()  # heavy ties
    expected = torchvision.ops.nms(boxes, scores, 0.5)
    torch.testing.assert_close(kernels.nms(boxes, scores, 0.5), expected, rtol=0, atol=0)


def test_nms_degenerate_boxes_match() -> None:
    boxes = torch.tensor(
        [
            [0.0, 0, 0, 0],
            [0, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 1, 1],
            [0, 0, 1, 1],
            [0, 0, float("inf"), 1],
            [-1, -1, 2, 2],
        ]
    )
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, float("nan")])
    expected = torchvision.ops.nms(boxes, scores, 0.5)
    torch.testing.assert_close(kernels.nms(boxes, scores, 0.5), expected, rtol=0, atol=0)


@pytest.mark.parametrize("n", [0, 10, 1000, 1001, 4000], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("classes", [1, 3, 80], ids=lambda c: f"{c}cls")
def test_batched_nms_keeps_exactly_what_torchvision_keeps(n: int, classes: int) -> None:
    boxes, scores = _boxes(n, True), _distinct_scores(n)
    idxs = torch.randint(0, classes, (n,))
    expected = torchvision.ops.batched_nms(boxes, scores, idxs, 0.5)
    got = kernels.batched_nms(boxes, scores, idxs, 0.5)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_batched_nms_ties_small_input_match() -> None:
    boxes, scores = _boxes(800, True), torch.randint(0, 3, (800,)).float()
    idxs = torch.randint(0, 4, (800,), dtype=torch.int32)
    expected = torchvision.ops.batched_nms(boxes, scores, idxs, 0.5)
    got = kernels.batched_nms(boxes, scores, idxs, 0.5)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_nms_counts_supersteps_and_iou_flops() -> None:
    kernels.reset_counters()
    kernels.nms(_boxes(1000, False), _distinct_scores(1000), 0.5)
    stats = kernels.counters()["nms"]
    assert stats.calls == 1 and stats.flops > 12 * 1000
    assert stats.supersteps >= 1000 // 256


_BOX = torch.tensor([[0.0, 0, 1, 1]])
_NAN_BOX = torch.tensor([[0.0, float("nan"), 1, 1]])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: kernels.nms(torch.rand(3, 5), torch.rand(3), 0.5), r"\[N, 4\].*\[3, 5\]"),
        (lambda: kernels.nms(torch.rand(3, 4), torch.rand(2), 0.5), r"got 3 and 2"),
        (lambda: kernels.nms(torch.rand(3, 4), torch.rand(3, 1), 0.5), r"1-D.*\[3, 1\]"),
        (lambda: kernels.nms(_BOX.half(), torch.rand(1).half(), 0.5), r"float32 or float64"),
        (lambda: kernels.nms(_BOX, torch.rand(1).double(), 0.5), r"same dtype"),
        (lambda: kernels.nms(_NAN_BOX, torch.rand(1), 0.5), r"NaN coordinates \(1 of 1"),
        (
            lambda: kernels.batched_nms(_BOX, torch.rand(1), torch.tensor([0.5]), 0.5),
            r"integer class ids",
        ),
        (
            lambda: kernels.batched_nms(_BOX, torch.rand(1), torch.tensor([0, 1]), 0.5),
            r"one class per box \(1\).*\[2\]",
        ),
    ],
    ids=[
        "box-width",
        "length",
        "scores-2d",
        "half",
        "dtype-mismatch",
        "nan",
        "float-idxs",
        "idxs-length",
    ],
)
def test_bad_input_raises_clear_errors(call, match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        call()


def test_opcheck() -> None:
    boxes, scores = _boxes(100, True), _distinct_scores(100)
    idxs = torch.randint(0, 3, (100,))
    torch.library.opcheck(torch.ops.poptorch_sim.nms.default, (boxes, scores, 0.5))
    torch.library.opcheck(torch.ops.poptorch_sim.batched_nms.default, (boxes, scores, idxs, 0.5))
