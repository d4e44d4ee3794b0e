"""Decoding and point-cloud ops: ``ctc_beam_search_decoder``, ``fps`` and ``nearest``.

``ctc_beam_search_decoder`` is a CTC prefix beam search on the host (PopLibs runs the same
algorithm on tiles); ``fps`` and ``nearest`` follow ``torch_cluster``'s semantics, which PopTorch
Geometric reproduces on the IPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import createPoptorchError
from .fx_leaf import fx_leaf

__all__ = ["ctc_beam_search_decoder", "fps", "nearest"]

Prefix = tuple[int, ...]
Beam = tuple[float, float]  # (log p ending in blank, log p ending in a label)
_NEG_INF = -math.inf


def _logadd(a: float, b: float) -> float:
    if a == _NEG_INF:
        return b
    if b == _NEG_INF:
        return a
    top = max(a, b)
    return top + math.log1p(math.exp(-abs(a - b)))


def _extend(
    beams: dict[Prefix, Beam], step: Sequence[float], blank: int
) -> dict[Prefix, list[float]]:
    """One time step of the prefix beam search: every beam followed by every class."""
    grown: dict[Prefix, list[float]] = {}

    def add(prefix: Prefix, slot: int, value: float) -> None:
        entry = grown.setdefault(prefix, [_NEG_INF, _NEG_INF])
        entry[slot] = _logadd(entry[slot], value)

    for prefix, (p_blank, p_label) in beams.items():
        total = _logadd(p_blank, p_label)
        add(prefix, 0, total + step[blank])
        for label, logp in enumerate(step):
            if label == blank:
                continue
            if prefix and prefix[-1] == label:
                add(prefix, 1, p_label + logp)  # a repeat without a blank collapses
                add((*prefix, label), 1, p_blank + logp)
            else:
                add((*prefix, label), 1, total + logp)
    return grown


def _decode_one(
    log_probs: list[list[float]], blank: int, beam_width: int, top_paths: int
) -> list[tuple[float, Prefix]]:
    beams: dict[Prefix, Beam] = {(): (0.0, _NEG_INF)}
    for step in log_probs:
        grown = _extend(beams, step, blank)
        ranked = sorted(grown.items(), key=lambda kv: (-_logadd(*kv[1]), kv[0]))
        beams = {prefix: (pb, pl) for prefix, (pb, pl) in ranked[:beam_width]}
    scored = sorted(((_logadd(*b), p) for p, b in beams.items()), key=lambda s: (-s[0], s[1]))
    return scored[:top_paths]


@fx_leaf(num_outputs=3)
def ctc_beam_search_decoder(
    probs: torch.Tensor,
    lengths: torch.Tensor,
    blank: int = 0,
    beam_width: int = 100,
    top_paths: int = 1,
) -> list[torch.Tensor]:
    """Find the ``top_paths`` most likely label sequences under CTC (prefix beam search).

    Args:
        probs: log-probabilities, ``[input_length, batch_size, num_classes]``.
        lengths: the valid length of each batch entry, ``[batch_size]``.
        blank: the blank class.
        beam_width: number of prefixes kept at each time step.
        top_paths: number of paths returned per batch entry.

    Returns:
        ``[path log-probabilities [batch, top_paths], path lengths [batch, top_paths] (int32),
        paths [batch, top_paths, input_length] (int32, zero-padded)]``; missing paths have
        log-probability ``-inf`` and length 0.

    Raises:
        poptorch.Error: ``probs`` or ``lengths`` is not a tensor, or ``probs`` is not 3-d.

    >>> lp = torch.tensor([[[-9.0, 0.0]], [[0.0, -9.0]]])  # label 1, then blank
    >>> ctc_beam_search_decoder(lp, torch.tensor([2]))[2]
    tensor([[[1, 0]]], dtype=torch.int32)
    """
    for arg, value in (("probs", probs), ("lengths", lengths)):
        if not isinstance(value, torch.Tensor):
            raise createPoptorchError(
                f"ctc_beam_search_decoder: {arg} must be a torch.tensor argument. "
                f"{type(value)} is not supported."
            )
    if probs.dim() != 3:
        raise createPoptorchError("Incorrect shape for first input to CTC beam search decoder.")
    time, batch, _ = probs.shape
    out_probs = torch.full((batch, top_paths), _NEG_INF, dtype=probs.dtype)
    out_lengths = torch.zeros((batch, top_paths), dtype=torch.int32)
    out_paths = torch.zeros((batch, top_paths, time), dtype=torch.int32)
    values = probs.detach().double().cpu()
    for b in range(batch):
        steps = values[: int(lengths[b]), b].tolist()
        for k, (score, path) in enumerate(_decode_one(steps, blank, beam_width, top_paths)):
            out_probs[b, k] = score
            out_lengths[b, k] = len(path)
            out_paths[b, k, : len(path)] = torch.tensor(path, dtype=torch.int32)
    # Decoded on the host, returned beside the input (a stage on CUDA keeps its device).
    return [t.to(probs.device) for t in (out_probs, out_lengths, out_paths)]


def _fps_segment(points: torch.Tensor, count: int, random_start: bool) -> torch.Tensor:
    first = int(torch.randint(points.shape[0], ())) if random_start else 0
    picked = [first]
    dist = (points - points[first]).pow(2).sum(1)
    for _ in range(1, count):
        nxt = int(dist.argmax())
        picked.append(nxt)
        dist = torch.minimum(dist, (points - points[nxt]).pow(2).sum(1))
    return torch.tensor(picked, dtype=torch.long)


@fx_leaf()
def fps(
    src: torch.Tensor, ptr: list[int], ratio: float = 0.5, random_start: bool = False
) -> torch.Tensor:
    """Farthest point sampling (``torch_cluster.fps``) over the segments ``ptr`` delimits.

    Args:
        src: point features ``[N, D]``.
        ptr: segment boundaries ``[0, n_0, n_0 + n_1, ..., N]`` (at least 2 entries).
        ratio: fraction of each segment to sample (``ceil(n * ratio)`` points).
        random_start: start each segment at a random point instead of its first.

    Returns:
        The sampled indices into ``src`` (``int64``), segment after segment.

    Raises:
        poptorch.Error: wrong argument types (PopTorch's messages).

    >>> fps(torch.tensor([[0.0], [1.0], [10.0]]), [0, 3], 0.5)
    tensor([0, 2])
    """
    if not isinstance(src, torch.Tensor):
        raise createPoptorchError(
            f"`fps` must take a torch.tensor input. {type(src)} is not supported."
        )
    if not isinstance(ptr, list):
        raise createPoptorchError("`ptr` must be a list of integers.")
    if len(ptr) < 2:
        raise createPoptorchError("`ptr` must containt at least 2 elements.")
    if not isinstance(ratio, float):
        raise createPoptorchError(
            f"`ratio` must be of float type. {type(ratio)} is not supported."
        )
    if not isinstance(random_start, bool):
        raise createPoptorchError(
            f"`random_start` must be of bool type. {type(random_start)} is not supported."
        )
    points = src.detach().reshape(src.shape[0], -1)
    dtype = src.dtype if src.is_floating_point() else torch.float32
    degrees = torch.tensor(ptr[1:], dtype=dtype) - torch.tensor(ptr[:-1], dtype=dtype)
    counts = torch.ceil(degrees * torch.tensor(ratio, dtype=dtype)).long().tolist()
    pieces = [
        ptr[i] + _fps_segment(points[ptr[i] : ptr[i + 1]], counts[i], random_start)
        for i in range(len(ptr) - 1)
        if counts[i] > 0
    ]
    picked = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
    return picked.to(src.device)


def _batch_vector(batch: list[int] | torch.Tensor, size: int, name: str) -> torch.Tensor:
    vector = torch.as_tensor(batch, dtype=torch.long)
    if vector.numel() == 0:
        return torch.zeros(size, dtype=torch.long)
    if vector.numel() != size:
        raise ValueError(f"'{name}' has {vector.numel()} entries but there are {size} points")
    if bool((vector[1:] < vector[:-1]).any()):
        raise ValueError(f"'{name}' is not sorted")
    return vector


@fx_leaf()
def nearest(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_x: list[int] | torch.Tensor | None = None,
    batch_y: list[int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """For each point of ``x``, the index of the nearest point of ``y`` in the same example.

    Args:
        x: points ``[N, D]`` (or ``[N]``).
        y: points ``[M, D]`` (or ``[M]``).
        batch_x: sorted example index of each point of ``x`` (a list or tensor; none: all 0).
        batch_y: sorted example index of each point of ``y``.

    Returns:
        ``int64`` indices into ``y``, ``[N]`` (ties go to the lowest index).

    Raises:
        poptorch.Error: wrong argument types (PopTorch's messages).
        ValueError: unsorted batch vectors, or examples present in only one of them
            (``torch_cluster``'s checks).

    >>> nearest(torch.tensor([[0.0], [9.0]]), torch.tensor([[1.0], [8.0]]))
    tensor([0, 1])
    """
    for arg, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor):
            raise createPoptorchError(
                f"`nearest` must take a torch.tensor `{arg}` input. {type(value)} is not "
                "supported."
            )
    for value in (batch_x, batch_y):
        if value is not None and not isinstance(value, (list, torch.Tensor)):
            raise createPoptorchError(
                "`batch_x` and `batch_y` must be torch.Tensors or lists while `batch_x` is of "
                f"type {type(batch_x)} and `batch_y` is of type {type(batch_y)}."
            )
    px = x.detach().reshape(x.shape[0], -1).double()
    py = y.detach().reshape(y.shape[0], -1).double()
    bx = _batch_vector([] if batch_x is None else batch_x, px.shape[0], "batch_x").to(px.device)
    by = _batch_vector([] if batch_y is None else batch_y, py.shape[0], "batch_y").to(px.device)
    if not torch.equal(bx.unique_consecutive(), by.unique_consecutive()):
        raise ValueError("Some batch indices occur in 'batch_x' that do not occur in 'batch_y'")
    dist = torch.cdist(px, py, compute_mode="donot_use_mm_for_euclid_dist")
    dist[bx[:, None] != by[None, :]] = math.inf
    return dist.argmin(dim=1)
