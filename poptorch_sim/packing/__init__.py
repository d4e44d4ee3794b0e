"""Sequence packing: offline (SPFHP/LPFHP), pack/unpack, packed datasets, BERT, and PackRunner.

Beyond PopTorch: this is PopRT's packing feature (reference ``poprt-features.md`` part c) on top
of ``inferenceModel``/``trainingModel``. Variable-length sequences share fixed-length rows, each
with its own position ids and a block-diagonal attention mask, so no sequence sees another and
every sample's outputs equal those of the model run on that sample alone.
"""

from __future__ import annotations

from .algorithms import PackGroup, pack_histogram, pack_lengths, packing_efficiency
from .batch import IGNORE_INDEX, MODEL_INPUTS, PackedBatch, UnpackInfo, pack, unpack
from .bert import (
    PackedBertForQuestionAnswering,
    PackedBertForSequenceClassification,
    block_diagonal_mask,
)
from .dataset import PackedDataset
from .runner import PackAlgorithm, PackRunner, PackRunnerConfig, PackRunnerStats

__all__ = [
    "IGNORE_INDEX",
    "MODEL_INPUTS",
    "PackAlgorithm",
    "PackGroup",
    "PackRunner",
    "PackRunnerConfig",
    "PackRunnerStats",
    "PackedBatch",
    "PackedBertForQuestionAnswering",
    "PackedBertForSequenceClassification",
    "PackedDataset",
    "UnpackInfo",
    "block_diagonal_mask",
    "pack",
    "pack_histogram",
    "pack_lengths",
    "packing_efficiency",
    "unpack",
]
