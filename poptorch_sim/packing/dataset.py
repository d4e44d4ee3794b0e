"""A map-style dataset of packed rows, for ``poptorch.DataLoader`` at a fixed combined batch size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from .algorithms import pack_lengths
from .batch import MODEL_INPUTS, PackedBatch, UnpackInfo, pack_rows

__all__ = ["PackedDataset"]


class PackedDataset(Dataset[dict[str, torch.Tensor]]):
    """Packs a dataset of variable-length samples once; item ``i`` is packed row ``i``.

    The packing is decided up front from the lengths (``pack_lengths``); rows are built on
    access. Each row is a dict of ``[L]`` token tensors and ``[K]`` per-sequence tensors (see
    ``packing.batch``), so the default collate stacks rows into a packed batch and
    ``UnpackInfo.from_batch`` recovers where every sample went.

    Args:
        samples: a map-style dataset (or sequence) of sample mappings.
        max_seq_len: tokens per row (``L``).
        max_sequences_per_pack: slots per row (``K``).
        algorithm: ``"spfhp"`` or ``"lpfhp"``.
        rows_multiple_of: append empty rows up to a multiple of this, normally the
            DataLoader's combined batch size (``batch_size × deviceIterations × replicas ×
            gradientAccumulation``), so that no sample is dropped with the last batch.

    Raises:
        ValueError: a sample longer than ``max_seq_len`` (from ``pack_lengths``).

    >>> rows = PackedDataset(samples, 128, 4, rows_multiple_of=8 * opts.device_iterations)  # doctest: +SKIP
    >>> loader = poptorch.DataLoader(opts, rows, batch_size=8)  # doctest: +SKIP
    """

    def __init__(
        self,
        samples: Sequence[Mapping[str, Any]] | Dataset[Mapping[str, Any]],
        max_seq_len: int,
        max_sequences_per_pack: int,
        algorithm: str = "spfhp",
        rows_multiple_of: int = 1,
    ) -> None:
        if rows_multiple_of < 1:
            raise ValueError(f"rows_multiple_of must be >= 1, got {rows_multiple_of}")
        self.samples = samples
        self.max_seq_len = max_seq_len
        self.max_sequences_per_pack = max_sequences_per_pack
        lengths = [len(samples[i]["input_ids"]) for i in range(len(samples))]  # type: ignore[arg-type]
        packs = pack_lengths(lengths, max_seq_len, max_sequences_per_pack, algorithm)
        self.packs: list[list[int]] = packs + [[]] * (-len(packs) % rows_multiple_of)
        first = samples[0] if len(samples) else {}  # type: ignore[arg-type]
        self.label_keys = [k for k in first if k not in ("input_ids", "token_type_ids")]

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        members = self.packs[index]
        batch = pack_rows(
            [self.samples[i] for i in members],
            [list(range(len(members)))],
            self.max_seq_len,
            self.max_sequences_per_pack,
            sample_ids=members,
            label_keys=self.label_keys,
        )
        return {k: v[0] for k, v in batch.as_dict().items()}

    def packed_batch(self, batch: Mapping[str, torch.Tensor]) -> PackedBatch:
        """Split a collated batch of rows into model inputs, labels and unpack info."""
        inputs = {k: batch[k] for k in MODEL_INPUTS}
        labels = {k: v for k, v in batch.items() if k not in inputs and k != "sample_index"}
        return PackedBatch(inputs, labels, UnpackInfo.from_batch(batch))
