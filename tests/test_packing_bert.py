"""The packed BERT equals the unpacked transformers BERT on every sample: eager, inference, training."""

from __future__ import annotations

import copy

import pytest
import torch

import poptorch_sim as poptorch
from poptorch_sim.packing import (
    PackedBertForQuestionAnswering,
    PackedBertForSequenceClassification,
    PackedDataset,
    UnpackInfo,
    block_diagonal_mask,
    pack,
    unpack,
)

transformers = pytest.importorskip("transformers")

MAX_LEN, SLOTS = 24, 4


def _config(attn: str = "sdpa", num_labels: int = 3) -> transformers.BertConfig:
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=MAX_LEN,
        hidden_dropout_prob=0.0,  # dropout draws differ between packed and unpacked runs
        attention_probs_dropout_prob=0.0,
        num_labels=num_labels,
    )
    config._attn_implementation = attn
    return config


def _samples(n: int, qa: bool = False) -> list[dict]:
    lengths = torch.randint(2, MAX_LEN + 1, (n,)).tolist()
    samples = []
    for i, length in enumerate(lengths):
        sample = {
            "input_ids": torch.randint(1, 64, (length,)),
            "token_type_ids": (torch.arange(length) >= length // 2).long(),
        }
        if qa:
            sample["start_positions"] = i % length
            sample["end_positions"] = (3 * i) % length
        else:
            sample["labels"] = i % 3
        samples.append(sample)
    return samples


def _alone(model: torch.nn.Module, sample: dict, **labels: torch.Tensor) -> object:
    """The unpacked model on one sample at its own length (no padding, no mask)."""
    return model(
        input_ids=sample["input_ids"][None],
        token_type_ids=sample["token_type_ids"][None],
        **labels,
    )


def test_block_diagonal_mask_keeps_each_sequence_and_padding_to_itself() -> None:
    mask = block_diagonal_mask(torch.tensor([[1, 1, 2, 0]]), torch.float32)[0, 0]
    allowed = [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert mask.eq(0).int().tolist() == allowed
    assert mask[0, 2] == torch.finfo(torch.float32).min


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_classification_equals_each_sample_alone(attn: str) -> None:
    model = transformers.BertForSequenceClassification(_config(attn)).eval()
    samples = _samples(12)
    batch = pack(samples, MAX_LEN, SLOTS, algorithm="lpfhp")
    packed = PackedBertForSequenceClassification(model, SLOTS)
    logits, loss = packed(**batch.inputs, labels=batch.labels["labels"])
    per_sample = unpack(logits, batch.info)
    losses = []
    for i, sample in enumerate(samples):
        ref = _alone(model, sample, labels=torch.tensor([sample["labels"]]))
        torch.testing.assert_close(per_sample[i], ref.logits[0])
        losses.append(ref.loss)
    torch.testing.assert_close(loss, torch.stack(losses).mean())  # per sequence, not per pack


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_packed_question_answering_equals_each_sample_alone(attn: str) -> None:
    model = transformers.BertForQuestionAnswering(_config(attn, num_labels=2)).eval()
    samples = _samples(12, qa=True)
    batch = pack(samples, MAX_LEN, SLOTS)
    packed = PackedBertForQuestionAnswering(model, SLOTS)
    start, end, loss = packed(**batch.inputs, **batch.labels)
    starts, ends = unpack(start, batch.info), unpack(end, batch.info)
    losses = []
    for i, sample in enumerate(samples):
        positions = {k: torch.tensor([sample[k]]) for k in ("start_positions", "end_positions")}
        ref = _alone(model, sample, **positions)
        torch.testing.assert_close(starts[i], ref.start_logits[0])
        torch.testing.assert_close(ends[i], ref.end_logits[0])
        losses.append(ref.loss)
    torch.testing.assert_close(loss, torch.stack(losses).mean())


def test_packed_heads_reject_models_they_cannot_pack() -> None:
    config = _config()
    config.problem_type = "multi_label_classification"
    model = transformers.BertForSequenceClassification(config)
    with pytest.raises(ValueError, match="single-label classification.*multi_label"):
        PackedBertForSequenceClassification(model, SLOTS)
    with pytest.raises(TypeError, match="expected a transformers BERT model, got Linear"):
        PackedBertForQuestionAnswering(torch.nn.Linear(2, 2), SLOTS)


def _batches(samples: list[dict], opts: poptorch.Options, batch_size: int) -> list[dict]:
    combined = batch_size * opts.device_iterations * opts.Training.gradient_accumulation
    rows = PackedDataset(samples, MAX_LEN, SLOTS, rows_multiple_of=combined)
    return list(poptorch.DataLoader(opts, rows, batch_size=batch_size))


INPUTS = ("input_ids", "attention_mask", "position_ids", "token_type_ids")


@pytest.mark.parametrize("qa", [False, True], ids=["classification", "qa"])
def test_inference_model_outputs_equal_each_sample_alone(qa: bool) -> None:
    if qa:
        model = transformers.BertForQuestionAnswering(_config(num_labels=2)).eval()
        packed = PackedBertForQuestionAnswering(model, SLOTS)
    else:
        model = transformers.BertForSequenceClassification(_config()).eval()
        packed = PackedBertForSequenceClassification(model, SLOTS)
    samples = _samples(20, qa=qa)
    opts = poptorch.Options().deviceIterations(2)
    inference = poptorch.inferenceModel(packed, opts)
    results: dict[int, object] = {}
    for batch in _batches(samples, opts, batch_size=2):
        results.update(
            unpack(inference(*(batch[k] for k in INPUTS)), UnpackInfo.from_batch(batch))
        )
    assert sorted(results) == list(range(len(samples)))
    for i, sample in enumerate(samples):
        ref = _alone(model, sample)
        if qa:
            torch.testing.assert_close(results[i], (ref.start_logits[0], ref.end_logits[0]))
        else:
            torch.testing.assert_close(results[i], ref.logits[0])
    inference.destroy()


@pytest.mark.parametrize(
    "qa, di, ga", [(False, 2, 1), (True, 1, 2)], ids=["classification-di2", "qa-ga2"]
)
def test_training_model_matches_the_unpacked_loop(qa: bool, di: int, ga: int) -> None:
    """Losses, then weights after every step, equal the plain loop over the same samples."""
    if qa:
        model = transformers.BertForQuestionAnswering(_config(num_labels=2))
        label_keys: tuple[str, ...] = ("start_positions", "end_positions")
        packed: torch.nn.Module = PackedBertForQuestionAnswering(model, SLOTS)
    else:
        model = transformers.BertForSequenceClassification(_config())
        label_keys = ("labels",)
        packed = PackedBertForSequenceClassification(model, SLOTS)
    reference = copy.deepcopy(model)
    initial = model.bert.embeddings.word_embeddings.weight.detach().clone()
    samples = _samples(16, qa=qa)
    opts = poptorch.Options().deviceIterations(di)
    opts.Training.gradientAccumulation(ga)
    training = poptorch.trainingModel(
        packed, opts, poptorch.optim.SGD(packed.parameters(), lr=0.5)
    )
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    mb = 2  # packed rows per micro-batch
    for batch in _batches(samples, opts, batch_size=mb):
        training(*(batch[k] for k in INPUTS), *(batch[k] for k in label_keys))
        for step in range(di):
            optimizer.zero_grad()
            for a in range(ga):
                rows = slice((step * ga + a) * mb, (step * ga + a + 1) * mb)
                ids = [i for i in batch["sample_index"][rows].flatten().tolist() if i >= 0]
                losses = [
                    _alone(
                        reference,
                        samples[i],
                        **{k: torch.tensor([samples[i][k]]) for k in label_keys},
                    ).loss
                    for i in ids
                ]
                if losses:  # PopTorch's Mean reduction: each micro-batch's loss / GA
                    (torch.stack(losses).mean() / ga).backward()
            optimizer.step()
    training.copyWeightsToHost()
    for (name, got), (_, want) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(got, want, msg=name)
    assert not torch.equal(model.bert.embeddings.word_embeddings.weight, initial)  # it trained
    training.destroy()
