"""The small samples :mod:`.simd_choice` times each kernel family's SIMD variants on.

Each is made when its family is measured and runs one tile's worth of the family's kernel:
sorts of one row length class (float32), NMS of 1000 boxes, accumulation of 2^16 items, a
fused Adam step over 2^14 parameters. Operands are made with explicit dtype and device, so a
default dtype or device context set by the caller does not change what is timed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["SAMPLES", "Sample"]

# Each family's sample: a function that makes it and returns the call to time.
Sample = Callable[[], Callable[[], object]]


def _sort_sample(rows: int, length: int) -> Sample:
    def make() -> Callable[[], object]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, length, generator=g, dtype=torch.float32, device="cpu")
        return lambda: torch.ops.poptorch_sim.sort(x)

    return make


def _nms_sample() -> Callable[[], object]:
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(1000, 2, generator=g, dtype=torch.float32, device="cpu") * 200
    size = torch.rand(1000, 2, generator=g, dtype=torch.float32, device="cpu") * 40 + 1
    boxes = torch.cat([xy, xy + size], dim=1)
    scores = torch.rand(1000, generator=g, dtype=torch.float32, device="cpu")
    return lambda: torch.ops.poptorch_sim.nms(boxes, scores, 0.5)


def _accumulate_sample() -> Callable[[], object]:
    from .optim import accumulate_

    g = torch.Generator().manual_seed(0)
    accum = torch.randn(1 << 16, generator=g, dtype=torch.float32, device="cpu")
    grad = torch.randn(1 << 16, generator=g, dtype=torch.float32, device="cpu")
    return lambda: accumulate_(accum, grad, 0.5)


def _optimizer_sample() -> Callable[[], object]:
    from .optim import adam_step_

    g = torch.Generator().manual_seed(0)
    params, grads, m, v = (
        [torch.randn(1 << 14, generator=g, dtype=torch.float32, device="cpu")] for _ in range(4)
    )
    v[0].abs_()
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    return lambda: adam_step_(params, grads, m, v, [1.0], decoupled_weight_decay=True, **hyper)


SAMPLES: dict[str, Sample] = {
    "sort_rows_16": _sort_sample(4096, 16),
    "sort_rows_256": _sort_sample(256, 256),
    "sort_rows_4096": _sort_sample(16, 4096),
    "sort_rows_32768": _sort_sample(2, 32768),
    "sort_long": _sort_sample(1, 1 << 17),
    "nms": _nms_sample,
    "accumulate": _accumulate_sample,
    "optimizer": _optimizer_sample,
}
