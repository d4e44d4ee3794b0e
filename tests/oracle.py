"""The eager PyTorch loops that poptorch_sim's executions stand for (the test oracle).

``train_reference`` is reference §2.2's loop written out plainly: for each device iteration,
``GA × R`` micro-batches in [DI, GA, R] order, each ``loss / (GA·R)`` (Mean) or ``loss`` (Sum)
backpropagated, then one optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from poptorch_sim.enums import OutputMode


def micro_batches(t: torch.Tensor, di: int, ga: int, r: int) -> torch.Tensor:
    """View a host tensor as [DI, GA, R, mb, ...]."""
    return t.reshape(di, ga, r, t.shape[0] // (di * ga * r), *t.shape[1:])


def train_reference(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: tuple[torch.Tensor, ...],
    di: int,
    ga: int,
    r: int,
    mean: bool = True,
    loss_index: int = 1,
    clip: float | None = None,
) -> list[list[list[Any]]]:
    """Run the reference training loop; return outputs[d][a][r] (tuples of detached tensors)."""
    views = [micro_batches(t, di, ga, r) for t in inputs]
    outs: list[list[list[Any]]] = []
    for d in range(di):
        optimizer.zero_grad()
        per_d = []
        for a in range(ga):
            per_a = []
            for rep in range(r):
                out = model(*(v[d, a, rep] for v in views))
                loss = out[loss_index] if isinstance(out, tuple) else out
                (loss / (ga * r) if mean else loss).backward()
                per_a.append(
                    tuple(o.detach() for o in out) if isinstance(out, tuple) else out.detach()
                )
            per_d.append(per_a)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        outs.append(per_d)
    return outs


def expected_output(
    outs: list[list[list[Any]]], mode: OutputMode, period: int, pick: Callable[[Any], torch.Tensor]
) -> torch.Tensor:
    """Assemble reference outputs per OutputMode (reference §2.3)."""
    di, ga, r = len(outs), len(outs[0]), len(outs[0][0])
    if mode == OutputMode.All:
        parts = [pick(outs[d][a][x]) for d in range(di) for a in range(ga) for x in range(r)]
    elif mode == OutputMode.EveryN:
        parts = [
            pick(outs[d][a][x])
            for d in range(period - 1, di, period)
            for a in range(ga)
            for x in range(r)
        ]
    elif mode == OutputMode.Final:
        parts = [pick(outs[di - 1][ga - 1][x]) for x in range(r)]
    else:
        parts = [sum(pick(outs[d][a][x]) for d in range(di) for a in range(ga)) for x in range(r)]
    if len(parts) == 1:
        return parts[0]
    if parts[0].dim() == 0:
        return torch.stack(parts)
    return torch.cat(parts)
