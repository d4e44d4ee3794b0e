"""Every SIMD variant of the C++ loops gives the same bits (see [Note: SIMD variants])."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from poptorch_sim import kernels
from poptorch_sim.kernels import engine
from poptorch_sim.kernels import optim as kopt

LEVELS = engine.SIMD_LEVELS[: engine.SIMD_LEVELS.index(kernels.supported_simd_level()) + 1]
# Each level below the widest this CPU runs, compared with the widest.
NARROWER = [
    pytest.param(
        level,
        marks=pytest.mark.skipif(
            level not in LEVELS[:-1], reason=f"{level} is not narrower than {LEVELS[-1]} here"
        ),
    )
    for level in engine.SIMD_LEVELS[:-1]
]


def _sort() -> list[torch.Tensor]:
    # Long enough for the scatter sort (key making and write-out loops); NaN and -0.0 in it.
    x = torch.randn(1 << 17, generator=torch.Generator().manual_seed(0))
    x[::997] = float("nan")
    x[5::1013] = -0.0
    return [*kernels.sort(x), *kernels.sort(x.half(), descending=True)]


def _nms() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(3000, 2, generator=g) * 200
    boxes = torch.cat([xy, xy + torch.rand(3000, 2, generator=g) * 40 + 1], dim=1)
    scores = torch.rand(3000, generator=g)
    return [kernels.nms(boxes, scores, 0.5), kernels.nms(boxes.double(), scores.double(), 0.3)]


def _accumulate() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    accum = torch.randn(70_001, generator=g)
    kopt.accumulate_(accum, torch.randn(70_001, generator=g), 0.37)
    return [accum]


def _optimizers() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    shapes = [(301, 17), (4096,), (5,)]
    out: list[torch.Tensor] = []
    for step in ("adam", "lamb"):
        params = [torch.randn(s, generator=g) for s in shapes]
        grads = [torch.randn(s, generator=g) for s in shapes]
        m = [torch.randn(s, generator=g) for s in shapes]
        v = [torch.rand(s, generator=g) for s in shapes]
        common = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
        if step == "adam":
            kopt.adam_step_(params, grads, m, v, [3.0] * 3, decoupled_weight_decay=True,
                            loss_scaling=128.0, clip_coef=0.7, **common)  # fmt: skip
        else:
            kopt.lamb_step_(params, grads, m, v, [3.0] * 3, max_weight_norm=5.0, **common)
        out += params + m + v
    out.append(kopt.grad_norm(grads, loss_scaling=3.0))
    return out


CASES: list[Callable[[], list[torch.Tensor]]] = [_sort, _nms, _accumulate, _optimizers]


@pytest.mark.parametrize("level", NARROWER)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__.strip("_"))
def test_narrower_variant_gives_the_same_bits(case, level: str) -> None:
    with kernels.simd(LEVELS[-1]):
        widest = case()
    with kernels.simd(level):
        assert kernels.simd_level() == level
        narrower = case()
    for got, want in zip(narrower, widest, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))


def test_level_is_clamped_to_the_cpu_and_restored() -> None:
    before = kernels.simd_level()
    with kernels.simd("avx512"):
        assert kernels.simd_level() == kernels.supported_simd_level()
    assert kernels.simd_level() == before


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown SIMD level 'sse9'; use one of base, avx2"):
        kernels.set_simd_level("sse9")
    with pytest.raises(RuntimeError, match="unknown SIMD level 'sse9'"):
        torch.ops.poptorch_sim.engine_set_simd_level("sse9")
