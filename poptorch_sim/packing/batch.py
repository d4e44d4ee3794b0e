"""Packed batches: samples concatenated into fixed-length rows, and outputs split back per sample.

A sample is a mapping with ``input_ids`` (1-D ints), optionally ``token_type_ids`` of the same
length, and any per-sequence labels (scalars such as ``labels``, ``start_positions``). A packed
batch of ``P`` rows, ``L = max_seq_len`` tokens and ``K = max_sequences_per_pack`` slots:

    key               shape   content
    input_ids         [P, L]  the packed sequences' tokens, back to back, then 0
    attention_mask    [P, L]  1-based slot of the sequence the token belongs to; 0 = padding
    position_ids      [P, L]  0..len-1, restarting with each sequence
    token_type_ids    [P, L]  the sequences' token types (0 where a sample has none)
    <label>           [P, K]  the per-sequence labels; -100 in empty slots
    sample_index      [P, K]  which sample sits in each slot; -1 = empty

``attention_mask`` is the sequence index Graphcore's packed BERT uses; a model turns it into a
block-diagonal mask on device (``packing.bert.block_diagonal_mask``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .algorithms import pack_lengths

__all__ = ["IGNORE_INDEX", "MODEL_INPUTS", "PackedBatch", "UnpackInfo", "pack", "unpack"]

IGNORE_INDEX = -100
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "token_type_ids")
_TOKEN_FIELDS = ("input_ids", "token_type_ids")


@dataclass(frozen=True)
class UnpackInfo:
    """Where each sample sits in a packed batch.

    Attributes:
        sample_index: ``[P, K]`` sample id per slot, -1 for an empty slot.
        starts: ``[P, K]`` first token of each slot's sequence.
        lengths: ``[P, K]`` tokens of each slot's sequence (0 when empty).
        max_seq_len: tokens per row (``L``).
    """

    sample_index: torch.Tensor
    starts: torch.Tensor
    lengths: torch.Tensor
    max_seq_len: int

    @property
    def max_sequences_per_pack(self) -> int:
        """Slots per row (``K``)."""
        return int(self.sample_index.shape[1])

    @property
    def num_samples(self) -> int:
        """How many samples the batch holds."""
        return int((self.sample_index >= 0).sum())

    @classmethod
    def from_batch(cls, batch: Mapping[str, torch.Tensor]) -> UnpackInfo:
        """Rebuild the info from a packed batch's ``attention_mask`` and ``sample_index``.

        This is how a batch that went through a ``DataLoader`` (rows collated) is unpacked.
        """
        mask, index = batch["attention_mask"], batch["sample_index"]
        slots = torch.arange(1, index.shape[1] + 1, device=mask.device)
        member = mask.unsqueeze(1) == slots[None, :, None]  # [P, K, L]
        lengths = member.sum(-1)
        starts = torch.where(lengths > 0, member.int().argmax(-1), 0)
        return cls(index.cpu(), starts.cpu(), lengths.cpu(), int(mask.shape[1]))


@dataclass(frozen=True)
class PackedBatch:
    """A packed batch: the model's inputs, the per-sequence labels, and how to unpack."""

    inputs: dict[str, torch.Tensor]
    labels: dict[str, torch.Tensor]
    info: UnpackInfo

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Inputs, labels and ``sample_index`` in one mapping (what a dataset row holds)."""
        return {**self.inputs, **self.labels, "sample_index": self.info.sample_index}


def _tokens(sample: Mapping[str, Any], key: str, index: int) -> np.ndarray:
    value = sample[key]
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"sample {index}: {key} must be 1-D, got shape {tuple(arr.shape)}")
    return arr


def _label_keys(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = [k for k in samples[0] if k not in _TOKEN_FIELDS] if samples else []
    for i, sample in enumerate(samples):
        if sorted(k for k in sample if k not in _TOKEN_FIELDS) != sorted(keys):
            raise ValueError(
                f"sample {i} has labels {sorted(sample)} but sample 0 has {sorted(samples[0])}: "
                "every sample needs the same keys"
            )
    return keys


def pack_rows(
    samples: Sequence[Mapping[str, Any]],
    packs: Sequence[Sequence[int]],
    max_seq_len: int,
    max_sequences_per_pack: int,
    sample_ids: Sequence[int] | None = None,
    label_keys: Sequence[str] | None = None,
) -> PackedBatch:
    """Lay ``samples`` out in rows as ``packs`` says (indices into ``samples``).

    ``sample_ids[i]`` is recorded as the id of ``samples[i]`` (default ``i``); ``label_keys``
    defaults to the samples' own (needed when there are none).
    """
    rows, length, slots = len(packs), max_seq_len, max_sequences_per_pack
    ids = list(range(len(samples))) if sample_ids is None else list(sample_ids)
    if label_keys is None:
        label_keys = _label_keys(samples)
    out = {k: np.zeros((rows, length), dtype=np.int64) for k in MODEL_INPUTS}
    labels = {k: np.full((rows, slots), IGNORE_INDEX, dtype=np.int64) for k in label_keys}
    index = np.full((rows, slots), -1, dtype=np.int64)
    starts, lengths = np.zeros((rows, slots), np.int64), np.zeros((rows, slots), np.int64)
    for row, members in enumerate(packs):
        if len(members) > slots:
            raise ValueError(
                f"pack {row} holds {len(members)} sequences, over "
                f"max_sequences_per_pack={max_sequences_per_pack}"
            )
        start = 0
        for slot, i in enumerate(members):
            tokens = _tokens(samples[i], "input_ids", i)
            end = start + len(tokens)
            if end > length:
                raise ValueError(f"pack {row} holds {end}+ tokens, over max_seq_len={length}")
            out["input_ids"][row, start:end] = tokens
            if "token_type_ids" in samples[i]:
                out["token_type_ids"][row, start:end] = _tokens(samples[i], "token_type_ids", i)
            out["attention_mask"][row, start:end] = slot + 1
            out["position_ids"][row, start:end] = np.arange(len(tokens))
            for key in label_keys:
                labels[key][row, slot] = int(samples[i][key])
            index[row, slot], starts[row, slot], lengths[row, slot] = ids[i], start, len(tokens)
            start = end
    info = UnpackInfo(*(torch.from_numpy(a) for a in (index, starts, lengths)), length)
    return PackedBatch(
        {k: torch.from_numpy(v) for k, v in out.items()},
        {k: torch.from_numpy(v) for k, v in labels.items()},
        info,
    )


def pack(
    samples: Sequence[Mapping[str, Any]],
    max_seq_len: int,
    max_sequences_per_pack: int | None = None,
    *,
    packs: Sequence[Sequence[int]] | None = None,
    algorithm: str = "spfhp",
    rows_multiple_of: int = 1,
) -> PackedBatch:
    """Pack variable-length samples into ``[rows, max_seq_len]`` tensors.

    Args:
        samples: mappings with ``input_ids`` (1-D), optional ``token_type_ids`` and scalar
            per-sequence labels (the same keys in every sample).
        max_seq_len: tokens per row.
        max_sequences_per_pack: slots per row (None: the most any pack uses).
        packs: which samples share a row; by default ``pack_lengths(..., algorithm)``.
        algorithm: the packing algorithm when ``packs`` is not given.
        rows_multiple_of: add empty rows until the row count is a multiple of this (a fixed
            combined batch size).

    Returns:
        The packed batch (see the module docstring for its layout).

    Raises:
        ValueError: a sample longer than ``max_seq_len``, a pack over the limits, or samples
            whose keys differ.

    >>> batch = pack([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}], max_seq_len=4)
    >>> batch.inputs["attention_mask"].tolist(), batch.inputs["position_ids"].tolist()
    ([[1, 1, 1, 2]], [[0, 1, 2, 0]])
    """
    lengths = [len(_tokens(s, "input_ids", i)) for i, s in enumerate(samples)]
    if packs is None:
        packs = pack_lengths(lengths, max_seq_len, max_sequences_per_pack, algorithm)
    slots = max_sequences_per_pack or max((len(p) for p in packs), default=1)
    packs = list(packs) + [[]] * (-len(packs) % rows_multiple_of)
    return pack_rows(samples, packs, max_seq_len, slots)


def _unpack_tensor(output: torch.Tensor, info: UnpackInfo, per: str) -> dict[int, torch.Tensor]:
    rows, slots = info.sample_index.shape
    if output.dim() < 2 or output.shape[0] != rows:
        raise ValueError(
            f"cannot unpack an output of shape {tuple(output.shape)}: expected [{rows}, "
            f"{info.max_seq_len} (tokens) or {slots} (sequences), ...]"
        )
    if per == "auto":
        if info.max_seq_len == slots:
            raise ValueError(
                "max_seq_len equals max_sequences_per_pack: pass per='token' or 'sequence'"
            )
        per = {info.max_seq_len: "token", slots: "sequence"}.get(int(output.shape[1]), "?")
    expected = {"token": info.max_seq_len, "sequence": slots}.get(per)
    if expected is None or output.shape[1] != expected:
        raise ValueError(
            f"cannot unpack an output of shape {tuple(output.shape)} per {per!r}: dim 1 must be "
            f"{info.max_seq_len} (per token) or {slots} (per sequence)"
        )
    result: dict[int, torch.Tensor] = {}
    for row, slot in (info.sample_index >= 0).nonzero().tolist():
        sample = int(info.sample_index[row, slot])
        if per == "sequence":
            result[sample] = output[row, slot]
        else:
            start, length = int(info.starts[row, slot]), int(info.lengths[row, slot])
            result[sample] = output[row, start : start + length]
    return dict(sorted(result.items()))


def unpack(outputs: Any, info: UnpackInfo, per: str = "auto") -> dict[int, Any]:
    """Split a packed model's outputs back into one output per sample.

    Args:
        outputs: a tensor ``[P, L, ...]`` (per token) or ``[P, K, ...]`` (per sequence), or a
            tuple / list / dict of them.
        info: the batch's ``UnpackInfo``.
        per: ``"token"``, ``"sequence"`` or ``"auto"`` (from dim 1 of each tensor).

    Returns:
        ``{sample id: output}`` in sample order; a per-token output keeps only the sample's own
        tokens (``[len, ...]``). Structured outputs keep their structure per sample.

    Raises:
        ValueError: an output whose shape matches neither layout.

    >>> batch = pack([{"input_ids": [5, 6, 7]}, {"input_ids": [8]}], max_seq_len=4)
    >>> unpack(batch.inputs["input_ids"], batch.info)
    {0: tensor([5, 6, 7]), 1: tensor([8])}
    """
    if isinstance(outputs, torch.Tensor):
        return _unpack_tensor(outputs, info, per)
    if isinstance(outputs, Mapping):
        parts = {k: unpack(v, info, per) for k, v in outputs.items()}
        samples = next(iter(parts.values()), {})
        return {s: {k: parts[k][s] for k in parts} for s in samples}
    if isinstance(outputs, (tuple, list)):
        split = [unpack(v, info, per) for v in outputs]
        samples = split[0] if split else {}
        return {s: type(outputs)(part[s] for part in split) for s in samples}
    raise TypeError(f"cannot unpack an output of type {type(outputs).__name__}")
