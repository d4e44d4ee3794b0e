"""Offline packing algorithms: which sequences share a pack, decided on the length histogram.

[Note: histogram packing]
Krell et al. (arXiv 2107.02027) observe that a packing only depends on how many sequences have
each length, not on which ones. Both algorithms here therefore work on *groups*: ``count``
identical packs with the same list of lengths, kept per remaining gap (free tokens). Lengths are
visited from the longest to the shortest; the sequences of one length go into the open group
whose gap is the tightest that still fits (best fit), splitting a group when fewer sequences are
left than it has packs. The cost grows with ``max_seq_len`` and the number of groups, never with
the number of sequences; indices are handed out at the end, per length, with numpy.

    SPFHP  shortest-pack-first histogram packing: one sequence joins a pack per step.
    LPFHP  longest-pack-first: as many copies of the current length as the gap (and the
           sequence limit) allows join a pack in one step, so short sequences fill big gaps
           together; the reference runs show slightly better efficiency than SPFHP.

A group is closed when its gap is 0 or it holds ``max_sequences_per_pack`` sequences.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "ALGORITHMS",
    "PackGroup",
    "pack_histogram",
    "pack_lengths",
    "packing_efficiency",
]

ALGORITHMS = ("spfhp", "lpfhp")


class PackGroup(NamedTuple):
    """``count`` packs that each hold sequences of ``lengths`` (longest first)."""

    count: int
    lengths: tuple[int, ...]


class _OpenGroups:
    """Groups of packs still open, stacked per remaining gap (index = free tokens)."""

    def __init__(self, max_seq_len: int, limit: int) -> None:
        self.max_seq_len = max_seq_len
        self.limit = limit
        self.by_gap: list[list[PackGroup]] = [[] for _ in range(max_seq_len + 1)]
        self.closed: list[PackGroup] = []

    def tightest(self, length: int) -> int | None:
        """The smallest gap >= ``length`` that has an open group, or None."""
        for gap in range(length, self.max_seq_len + 1):
            if self.by_gap[gap]:
                return gap
        return None

    def add(self, group: PackGroup) -> None:
        gap = self.max_seq_len - sum(group.lengths)
        if gap == 0 or len(group.lengths) >= self.limit:
            self.closed.append(group)
        else:
            self.by_gap[gap].append(group)

    def all_groups(self) -> list[PackGroup]:
        return self.closed + [g for stack in self.by_gap for g in stack]


def _place(groups: _OpenGroups, length: int, n: int, greedy: bool) -> None:
    """Put ``n`` sequences of ``length`` into packs (see [Note: histogram packing])."""
    while n > 0:
        gap = groups.tightest(length)
        if gap is None:
            repeat = min(groups.max_seq_len // length, groups.limit, n) if greedy else 1
            groups.add(PackGroup(n // repeat, (length,) * repeat))
            n -= (n // repeat) * repeat
            continue
        count, lengths = groups.by_gap[gap].pop()
        repeat = min(gap // length, groups.limit - len(lengths), n) if greedy else 1
        used = min(count, n // repeat)
        if count > used:
            groups.by_gap[gap].append(PackGroup(count - used, lengths))
        groups.add(PackGroup(used, lengths + (length,) * repeat))
        n -= used * repeat


def _check_limits(max_seq_len: int, max_sequences_per_pack: int | None, algorithm: str) -> int:
    if not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    limit = max_seq_len if max_sequences_per_pack is None else max_sequences_per_pack
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(
            f"max_sequences_per_pack must be a positive int or None, got {max_sequences_per_pack!r}"
        )
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown packing algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})"
        )
    return limit


def pack_histogram(
    histogram: Sequence[int] | np.ndarray,
    max_seq_len: int,
    max_sequences_per_pack: int | None = None,
    algorithm: str = "spfhp",
) -> list[PackGroup]:
    """Pack a length histogram into groups of identical packs.

    Args:
        histogram: ``histogram[l - 1]`` sequences have length ``l``, for ``l`` in
            ``1..max_seq_len``.
        max_seq_len: tokens per pack.
        max_sequences_per_pack: most sequences in one pack (None: no limit).
        algorithm: ``"spfhp"`` or ``"lpfhp"``.

    Returns:
        The groups; their counts times their lengths add up to the histogram.

    Raises:
        ValueError: a bad limit, an unknown algorithm, or a histogram of the wrong size.

    >>> pack_histogram([1, 0, 1, 1], 4, algorithm="spfhp")
    [PackGroup(count=1, lengths=(4,)), PackGroup(count=1, lengths=(3, 1))]
    """
    limit = _check_limits(max_seq_len, max_sequences_per_pack, algorithm)
    hist = np.asarray(histogram, dtype=np.int64)
    if hist.shape != (max_seq_len,) or (hist < 0).any():
        raise ValueError(
            f"histogram must hold {max_seq_len} non-negative counts (lengths 1..{max_seq_len}), "
            f"got shape {tuple(hist.shape)}"
        )
    groups = _OpenGroups(max_seq_len, limit)
    for length in range(max_seq_len, 0, -1):
        _place(groups, length, int(hist[length - 1]), greedy=algorithm == "lpfhp")
    return [g for g in groups.all_groups() if g.count > 0]


def _as_lengths(
    lengths: Sequence[int] | np.ndarray | torch.Tensor, max_seq_len: int
) -> np.ndarray:
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"lengths must be a 1-D sequence of ints, got {arr.dtype} {arr.shape}")
    arr = arr.astype(np.int64, copy=False)
    bad = np.flatnonzero((arr < 1) | (arr > max_seq_len))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"sequence {i} has length {int(arr[i])}, outside 1..max_seq_len={max_seq_len} "
            f"({bad.size} such sequences): truncate or split them, or raise max_seq_len"
        )
    return arr


def pack_lengths(
    lengths: Sequence[int] | np.ndarray | torch.Tensor,
    max_seq_len: int,
    max_sequences_per_pack: int | None = None,
    algorithm: str = "spfhp",
) -> list[list[int]]:
    """Decide which sequences share a pack.

    Args:
        lengths: the length of each sequence (tokens, each in ``1..max_seq_len``).
        max_seq_len: tokens per pack.
        max_sequences_per_pack: most sequences in one pack (None: no limit).
        algorithm: ``"spfhp"`` (shortest-pack-first) or ``"lpfhp"`` (longest-pack-first)
            histogram packing.

    Returns:
        One list of sequence indices per pack, longest sequence first; every index appears
        exactly once.

    Raises:
        ValueError: a length outside ``1..max_seq_len``, a bad limit or an unknown algorithm.

    >>> pack_lengths([3, 1, 2, 2], max_seq_len=4, algorithm="lpfhp")
    [[2, 3], [0, 1]]
    """
    _check_limits(max_seq_len, max_sequences_per_pack, algorithm)
    arr = _as_lengths(lengths, max_seq_len)
    hist = np.bincount(arr, minlength=max_seq_len + 1)[1:]
    groups = pack_histogram(hist, max_seq_len, max_sequences_per_pack, algorithm)
    # A stable radix sort on narrow keys: ten times faster than on int64 for a million lengths.
    keys = arr.astype(np.uint16) if max_seq_len < 2**16 else arr
    order = np.argsort(keys, kind="stable")
    # next_free[l]: position in ``order`` of the next unused sequence of length l
    next_free = np.concatenate(([0], np.cumsum(np.bincount(arr, minlength=max_seq_len + 1))))
    packs: list[list[int]] = []
    with _gc_paused():
        for count, group_lengths in groups:
            columns = []
            for length in group_lengths:
                start = int(next_free[length])
                columns.append(order[start : start + count])
                next_free[length] += count
            packs.extend(np.stack(columns, axis=1).tolist())
    return packs


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small lists (none form cycles).

    Each list allocation counts towards a collection, and a million of them would trigger
    full scans that cost several times the building itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def packing_efficiency(
    packs: Sequence[Sequence[int]],
    lengths: Sequence[int] | np.ndarray | torch.Tensor,
    max_seq_len: int,
) -> float:
    """The fraction of token slots holding real tokens: ``sum(lengths) / (packs * max_seq_len)``.

    Args:
        packs: sequence indices per pack (as from ``pack_lengths``).
        lengths: the length of each sequence.
        max_seq_len: tokens per pack.

    Returns:
        A value in ``(0, 1]``; padding everything to ``max_seq_len`` scores
        ``mean(lengths) / max_seq_len``.

    Raises:
        ValueError: no packs, or a pack over ``max_seq_len``.

    >>> packing_efficiency([[0, 1], [2]], [3, 1, 2], 4)
    0.75
    """
    arr = _as_lengths(lengths, max_seq_len)
    if not packs:
        raise ValueError("packing_efficiency needs at least one pack")
    sizes = np.fromiter((len(p) for p in packs), dtype=np.int64, count=len(packs))
    flat = np.fromiter(
        itertools.chain.from_iterable(packs), dtype=np.int64, count=int(sizes.sum())
    )
    pack_of_token = np.repeat(np.arange(len(packs)), sizes)
    tokens = np.bincount(pack_of_token, weights=arr[flat], minlength=len(packs)).astype(np.int64)
    over = np.flatnonzero(tokens > max_seq_len)
    if over.size:
        i = int(over[0])
        raise ValueError(f"pack {i} holds {int(tokens[i])} tokens, over max_seq_len={max_seq_len}")
    return float(tokens.sum()) / (len(packs) * max_seq_len)
