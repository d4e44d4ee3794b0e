"""A transformers BERT run on packed rows: block-diagonal attention and per-sequence heads.

The packed models wrap an existing ``transformers`` model and share its modules, so the same
weights answer packed and unpacked calls. Inputs are a packed batch's ``MODEL_INPUTS`` (see
``packing.batch``); ``attention_mask`` holds each token's 1-based sequence slot.

[Note: packed equals unpacked]
Every BERT module except self-attention works token by token, so packing changes nothing there
but the position ids, which restart per sequence. Attention gets an additive block-diagonal mask
built on device from the slots: a token attends only to tokens of its own sequence (padding to
padding), and the masked scores are ``finfo.min``, whose softmax weight is exactly 0. Heads read
each sequence where the unpacked model would: classification pools the sequence's first token
([CLS]); question answering scores every token, and its loss compares each sequence's logits,
realigned to start at 0, with positions relative to the sequence. Losses are means over the
sequences present (empty slots carry label -100), the value the unpacked model's mean loss
takes over the same samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.loss import identity_loss
from .batch import IGNORE_INDEX

__all__ = [
    "PackedBertForQuestionAnswering",
    "PackedBertForSequenceClassification",
    "block_diagonal_mask",
    "sequence_starts",
]


def block_diagonal_mask(sequence_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask ``[P, 1, L, L]`` that keeps each sequence to itself.

    Args:
        sequence_ids: ``[P, L]`` slot of each token (0 = padding).
        dtype: the attention scores' dtype.

    Returns:
        0 where query and key share a slot, ``finfo(dtype).min`` elsewhere.

    >>> block_diagonal_mask(torch.tensor([[1, 1, 2]]), torch.float32)[0, 0].eq(0).int()
    tensor([[1, 1, 0],
            [1, 1, 0],
            [0, 0, 1]], dtype=torch.int32)
    """
    same = sequence_ids[:, :, None] == sequence_ids[:, None, :]
    blocked = torch.zeros(same.shape, dtype=dtype, device=sequence_ids.device)
    return blocked.masked_fill(~same, torch.finfo(dtype).min)[:, None]


def sequence_starts(sequence_ids: torch.Tensor, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First token and length of each slot's sequence, both ``[P, slots]`` (0 when empty)."""
    numbers = torch.arange(1, slots + 1, device=sequence_ids.device)
    member = sequence_ids[:, None, :] == numbers[None, :, None]  # [P, K, L]
    lengths = member.sum(-1)
    return member.int().argmax(-1), lengths


def _mean_over_sequences(loss_sum: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # A batch of empty slots gives 0, not 0/0; see [Note: packed equals unpacked].
    count = (labels != IGNORE_INDEX).sum().clamp(min=1)
    return identity_loss(loss_sum / count, reduction="none")


class _PackedBert(nn.Module):
    def __init__(self, model: nn.Module, max_sequences_per_pack: int) -> None:
        super().__init__()
        if not hasattr(model, "bert"):
            raise TypeError(f"expected a transformers BERT model, got {type(model).__name__}")
        if max_sequences_per_pack < 1:
            raise ValueError(f"max_sequences_per_pack must be >= 1, got {max_sequences_per_pack}")
        self.bert = model.bert
        self.config = model.config
        self.max_sequences_per_pack = max_sequences_per_pack

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states ``[P, L, H]`` of the packed rows."""
        embeddings = self.bert.embeddings(
            input_ids=input_ids, position_ids=position_ids, token_type_ids=token_type_ids
        )
        mask = block_diagonal_mask(attention_mask, embeddings.dtype)
        return self.bert.encoder(embeddings, attention_mask=mask)[0]


class PackedBertForSequenceClassification(_PackedBert):
    """``BertForSequenceClassification`` on packed rows: one prediction per sequence.

    Args:
        model: a ``transformers.BertForSequenceClassification`` (single-label); its modules
            are shared, not copied.
        max_sequences_per_pack: slots per row (``K``).

    Call with the packed inputs (and ``labels [P, K]``, -100 in empty slots); returns logits
    ``[P, K, num_labels]``, or ``(logits, loss)`` with the loss averaged over sequences.

    >>> packed = PackedBertForSequenceClassification(hf_model, 4)  # doctest: +SKIP
    >>> logits, loss = packed(**batch.inputs, labels=batch.labels["labels"])  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, max_sequences_per_pack: int) -> None:
        super().__init__(model, max_sequences_per_pack)
        if model.bert.pooler is None or self.config.problem_type not in (
            None,
            "single_label_classification",
        ):
            raise ValueError(
                "PackedBertForSequenceClassification supports single-label classification with "
                f"a pooler; got problem_type={self.config.problem_type!r}"
            )
        self.dropout = model.dropout
        self.classifier = model.classifier

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Per-sequence logits, and the mean loss over sequences when ``labels`` are given."""
        hidden = self.encode(input_ids, attention_mask, position_ids, token_type_ids)
        starts, _ = sequence_starts(attention_mask, self.max_sequences_per_pack)
        first = hidden.gather(1, starts[..., None].expand(-1, -1, hidden.shape[-1]))
        pooler = self.bert.pooler
        logits = self.classifier(self.dropout(pooler.activation(pooler.dense(first))))
        if labels is None:
            return logits
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return logits, _mean_over_sequences(loss_sum, labels)


class PackedBertForQuestionAnswering(_PackedBert):
    """``BertForQuestionAnswering`` on packed rows: span logits per token, loss per sequence.

    Args:
        model: a ``transformers.BertForQuestionAnswering``; its modules are shared.
        max_sequences_per_pack: slots per row (``K``).

    Call with the packed inputs (and ``start_positions``/``end_positions [P, K]``, relative to
    each sequence, -100 in empty slots); returns ``(start_logits, end_logits)`` ``[P, L]``, plus
    the loss (``(CE_start + CE_end) / 2``, averaged over sequences) when positions are given.

    >>> packed = PackedBertForQuestionAnswering(hf_model, 4)  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, max_sequences_per_pack: int) -> None:
        super().__init__(model, max_sequences_per_pack)
        self.qa_outputs = model.qa_outputs

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """Start and end logits per token, and the loss when positions are given."""
        hidden = self.encode(input_ids, attention_mask, position_ids, token_type_ids)
        start_logits, end_logits = self.qa_outputs(hidden).unbind(-1)
        if start_positions is None or end_positions is None:
            return start_logits, end_logits
        starts, lengths = sequence_starts(attention_mask, self.max_sequences_per_pack)
        total = 0.5 * (
            self._span_loss(start_logits, start_positions, starts, lengths)
            + self._span_loss(end_logits, end_positions, starts, lengths)
        )
        return start_logits, end_logits, _mean_over_sequences(total, start_positions)

    @staticmethod
    def _span_loss(
        logits: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """Summed cross-entropy of each sequence's own logits (realigned to start at 0)."""
        rows, length = logits.shape
        offsets = torch.arange(length, device=logits.device)
        index = (starts[..., None] + offsets).clamp(max=length - 1)  # [P, K, L]
        aligned = logits.gather(1, index.flatten(1)).view(*index.shape)
        aligned = aligned.masked_fill(offsets >= lengths[..., None], torch.finfo(logits.dtype).min)
        # transformers ignores a position past the sequence (it clamps it to the length).
        valid = (positions >= 0) & (positions < lengths)
        target = torch.where(valid, positions, torch.full_like(positions, IGNORE_INDEX))
        return F.cross_entropy(
            aligned.flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
