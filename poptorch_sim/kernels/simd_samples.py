"""The small samples :mod:`.simd_choice` times each kernel family's SIMD variants on.

Each is made when its family is measured and runs one tile's worth of the family's kernel:
sorts of one row length class and key width (float16 for 16-bit keys, float32 for 32-bit,
float64 for 64-bit: normal values, whose 64-bit keys span more than the network's 32-bit window
and take its tie scan, see ``[Note: wide keys]``), NMS of 1000 boxes, accumulation of 2^16
items, a fused Adam step over 2^14 parameters. Operands are made with explicit dtype and device,
so a default dtype or device context set by the caller does not change what is timed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["SAMPLES", "Sample"]

# Each family's sample: a function that makes it and returns the call to time.
Sample = Callable[[], Callable[[], object]]


# The dtype each key width is sampled with.
_SORT_DTYPES = {16: torch.float16, 32: torch.float32, 64: torch.float64}


def _sort_sample(rows: int, length: int, bits: int) -> Sample:
    def make() -> Callable[[], object]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, length, generator=g, dtype=torch.float32, device="cpu")
        x = x.to(_SORT_DTYPES[bits])
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
    g = torch.Generator().manual_seed(0)
    accum = torch.randn(1 << 16, generator=g, dtype=torch.float32, device="cpu")
    grad = torch.randn(1 << 16, generator=g, dtype=torch.float32, device="cpu")
    return lambda: torch.ops.poptorch_sim.accumulate_(accum, grad, 0.5)


def _optimizer_sample() -> Callable[[], object]:
    g = torch.Generator().manual_seed(0)
    params, grads, m, v = (
        [torch.randn(1 << 14, generator=g, dtype=torch.float32, device="cpu")] for _ in range(4)
    )
    v[0].abs_()
    hyper = dict(
        lr=1e-3,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        weight_decay=0.0,
        decoupled_weight_decay=True,
        bias_correction=True,
        maximize=False,
        loss_scaling=1.0,
        clip_coef=1.0,
        chunk_elements=0,
    )  # the schema's order (csrc/optim/ops.h), as kernels.optim.adam_step_ passes them
    return lambda: torch.ops.poptorch_sim.adam_step_(params, grads, m, v, [1.0], **hyper)


SAMPLES: dict[str, Sample] = {
    **{
        f"sort_rows_{length}_{bits}bit": _sort_sample(rows, length, bits)
        for rows, length in ((4096, 16), (256, 256), (64, 1024), (16, 4096), (2, 32768))
        for bits in (16, 32, 64)
    },
    "sort_long_16bit": _sort_sample(1, 1 << 17, 16),
    "sort_long_32bit": _sort_sample(1, 1 << 17, 32),
    "nms": _nms_sample,
    "accumulate": _accumulate_sample,
    "optimizer": _optimizer_sample,
}
