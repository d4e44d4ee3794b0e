"""Real models split over IPUs as their users split them (optimum-graphcore's placements),
pipelined and sharded, training and inference, against eager PyTorch: Hugging Face BERT and
GPT-2 (captured with torch.export) and torchvision's ResNet-50. More transformers models, with
their default configs, are in ``test_transformers_models.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from model_checks import (
    cache_tensors,
    check_inference,
    check_training,
    execution_strategy,
    per_sample,
    stage_map,
    text_batch,
    workers_of_stages,
)
from torch import nn

import poptorch_sim as poptorch

transformers = pytest.importorskip("transformers")
torchvision = pytest.importorskip("torchvision")


# -- the models, blocks placed as optimum-graphcore places them -----------------------------------
def bert_config(**overrides: Any) -> Any:
    """A tiny BERT (4 layers, hidden 32), random init, no dropout (eager is the oracle)."""
    settings: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    settings.update(overrides)
    return transformers.BertConfig(**settings)


def place_bert(model: nn.Module, head: str) -> nn.Module:
    """Embeddings on IPU 0, encoder layer i on IPU i, the head on the last IPU."""
    bert = model.bert
    bert.embeddings = poptorch.BeginBlock(bert.embeddings, "Embedding", ipu_id=0)
    for i, layer in enumerate(bert.encoder.layer):
        bert.encoder.layer[i] = poptorch.BeginBlock(layer, f"Encoder{i}", ipu_id=i)
    setattr(model, head, poptorch.BeginBlock(getattr(model, head), "Head", ipu_id=3))
    return model


class QuestionAnswering(nn.Module):
    """BertForQuestionAnswering with its two losses made one, as optimum-graphcore does."""

    def __init__(self) -> None:
        super().__init__()
        bert = transformers.BertForQuestionAnswering(bert_config(num_labels=2))
        self.bert = place_bert(bert, "qa_outputs")

    def forward(self, input_ids, attention_mask, start_positions, end_positions):
        out = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            start_positions=start_positions,
            end_positions=end_positions,
        )
        return poptorch.identity_loss(out.loss, reduction="none"), out.start_logits


def bert_classifier() -> nn.Module:
    return place_bert(transformers.BertForSequenceClassification(bert_config()), "classifier")


def gpt2(**overrides: Any) -> nn.Module:
    """Tiny GPT-2 with tied embeddings: token embedding and LM head both on IPU 0.

    Its config keeps transformers' defaults but for the sizes and dropout: ``use_cache=True``
    (a ``DynamicCache`` in the outputs), masks from ``masking_utils``, SDPA attention."""
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=3,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **overrides,
    )
    model = transformers.GPT2LMHeadModel(config)
    assert model.lm_head.weight is model.transformer.wte.weight
    t = model.transformer
    t.wte = poptorch.BeginBlock(t.wte, "Token embedding", ipu_id=0)
    t.wpe = poptorch.BeginBlock(t.wpe, "Position embedding", ipu_id=0)
    for i, layer in enumerate(t.h):
        t.h[i] = poptorch.BeginBlock(layer, f"Layer{i}", ipu_id=i + 1)
    model.lm_head = poptorch.BeginBlock(model.lm_head, "LM head", ipu_id=0)
    return model


class ResNetWithLoss(nn.Module):
    """torchvision's ResNet-50, ``layer1``..``layer4`` starting blocks on IPUs 0..3.

    The network ``resnet50`` builds (the same blocks, layers and module names, so the same graph
    to split), with ``width_per_group=8``: each bottleneck's inner convolutions are 8 times
    narrower than ResNet-50's 64 (the blocks' outputs keep their 256 to 2048 channels), which
    makes a step several times cheaper and changes nothing the tests check."""

    def __init__(self) -> None:
        super().__init__()
        resnet = torchvision.models.resnet
        self.net = resnet.ResNet(
            resnet.Bottleneck,
            [3, 4, 6, 3],
            num_classes=10,
            zero_init_residual=True,
            width_per_group=8,
        )
        for i in range(4):
            name = f"layer{i + 1}"
            poptorch.BeginBlock(getattr(self.net, name), name, ipu_id=i)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, images: torch.Tensor, labels: torch.Tensor):
        logits = self.net(images)
        return logits, self.loss(logits, labels)


_GA = {"pipelined": 7, "sharded": 2}  # a 4-stage training pipeline needs 2 * 4 - 1
_BERT_STAGES = [
    (0, ("Embedding", "Encoder0")),
    (1, ("Encoder1",)),
    (2, ("Encoder2",)),
    (3, ("Encoder3", "Head")),
]


# -- BERT -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_bert_sequence_classification_trains_like_eager(strategy: str) -> None:
    ga = _GA[strategy]
    batch = {**text_batch(2 * ga), "labels": torch.randint(0, 3, (2 * ga,))}
    runner = check_training(
        bert_classifier(), batch, lambda o: (o.loss, o.logits), execution_strategy(strategy), ga=ga
    )
    assert runner.program.meta["capture"] == "torch.export"
    assert stage_map(runner) == _BERT_STAGES


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_bert_sequence_classification_infers_like_eager(strategy: str) -> None:
    runner = check_inference(
        bert_classifier(), text_batch(8), lambda o: o.logits, execution_strategy(strategy), di=4
    )
    assert stage_map(runner) == _BERT_STAGES


def test_bert_question_answering_trains_like_eager() -> None:
    batch = {
        **text_batch(14),
        "start_positions": torch.randint(0, 8, (14,)),
        "end_positions": torch.randint(0, 8, (14,)),
    }
    check_training(QuestionAnswering(), batch, lambda o: o, execution_strategy("pipelined"), ga=7)


def test_bert_stages_run_on_their_own_ipu_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pinned split: the trials of [Note: cores follow the work] may time one-thread mode on
    # the second call's first micro-batch (one worker for every stage).
    monkeypatch.setenv("POPTORCH_SIM_THREADS_PER_IPU", "1")
    model = bert_classifier()
    opts = poptorch.Options()
    opts.deviceIterations(4)
    inference = poptorch.inferenceModel(model.eval(), opts)
    batch = text_batch(8)
    inference(**batch)  # compiles
    runner = inference._executable.program
    seen = workers_of_stages(runner)
    inference(**batch)
    inference.destroy()
    expected = {s.index: {f"poptorch_sim IPU {s.ipu}"} for s in runner.program.stages}
    assert seen == expected
    assert len(set().union(*seen.values())) == 4


# -- GPT-2 ----------------------------------------------------------------------------------------
def loss_logits_cache(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss, and the logits with every layer's cached keys and values, per sample."""
    return out.loss, per_sample(out.logits, out.past_key_values)


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_gpt2_with_tied_head_back_on_ipu0_trains_like_eager(strategy: str) -> None:
    ga = 9 if strategy == "pipelined" else 2  # 5 stages: 2 * 5 - 1 when pipelined
    batch = text_batch(2 * ga)
    batch["labels"] = batch["input_ids"].clone()
    runner = check_training(
        gpt2(), batch, loss_logits_cache, execution_strategy(strategy, auto_increment=True), ga=ga
    )
    assert [s.ipu for s in runner.program.stages] == [0, 1, 2, 3, 0]
    first, last = runner.program.stages[0].module, runner.program.stages[-1].module
    tied = {id(p) for p in first.parameters()} & {id(p) for p in last.parameters()}
    assert len(tied) == 1  # wte.weight, used by the embedding and by the LM head


def test_gpt2_sharded_by_ipu_returns_to_ipu0_like_eager() -> None:
    # AutoStage.SameAsIpu: the LM head's block has stage id 0, like the embedding's. A sharded
    # program runs in program order, so the head is a stage of its own after IPU 3's.
    batch = text_batch(4)
    batch["labels"] = batch["input_ids"].clone()
    runner = check_training(gpt2(), batch, loss_logits_cache, execution_strategy("sharded"), ga=2)
    assert [s.ipu for s in runner.program.stages] == [0, 1, 2, 3, 0]
    runner = check_inference(
        gpt2(),
        text_batch(6),
        lambda o: per_sample(o.logits, o.past_key_values),
        execution_strategy("sharded"),
        di=3,
    )
    assert [s.ipu for s in runner.program.stages] == [0, 1, 2, 3, 0]


def test_gpt2_infers_like_eager() -> None:
    runner = check_inference(
        gpt2(),
        text_batch(10),
        lambda o: per_sample(o.logits, o.past_key_values),
        execution_strategy("pipelined", True),
        di=5,
    )
    assert runner.program.meta["capture"] == "torch.export"


def test_gpt2_without_cache_trains_like_eager() -> None:
    batch = text_batch(18)
    batch["labels"] = batch["input_ids"].clone()
    check_training(
        gpt2(use_cache=False),
        batch,
        lambda o: (o.loss, o.logits),
        execution_strategy("pipelined", auto_increment=True),
        ga=9,
    )


def test_gpt2_returns_its_cache_as_eager_does() -> None:
    model = gpt2().eval()
    opts = poptorch.Options().setExecutionStrategy(execution_strategy("sharded", True))
    inference = poptorch.inferenceModel(model, opts)
    batch = text_batch(2)
    out = inference(**batch)
    assert type(inference._executable.program).__name__ == "StagedRunner"
    with torch.no_grad():
        ref = model(**batch)
    inference.destroy()
    assert type(out) is type(ref)
    assert type(out.past_key_values) is type(ref.past_key_values)
    assert out.past_key_values.get_seq_length() == ref.past_key_values.get_seq_length() == 8
    for ours, theirs in zip(
        cache_tensors(out.past_key_values), cache_tensors(ref.past_key_values)
    ):
        torch.testing.assert_close(ours, theirs)


# -- ResNet-50 ------------------------------------------------------------------------------------
# A randomly initialised ResNet-50 is chaotic where its batch norms see few values: eager itself
# gives gradients 2% apart on 1 and 2 threads. With zero_init_residual (torchvision's option:
# each residual branch starts as identity) eager agrees with itself to 1e-5.
def test_resnet50_trains_sharded_like_eager() -> None:
    model = ResNetWithLoss()
    batch = {"images": torch.randn(8, 3, 32, 32), "labels": torch.randint(0, 10, (8,))}
    runner = check_training(
        model, batch, lambda o: (o[1], o[0]), execution_strategy("sharded"), 2, 4
    )
    assert runner.program.meta["capture"] == "torch.fx"
    assert [s.ipu for s in runner.program.stages] == [0, 1, 2, 3]


@pytest.mark.slow  # both: 20 s on two busy cores (2-vCPU Xeon, 2026-11-29; 1.5 min at full width)
@pytest.mark.parametrize("capture", ["fx", "export"])
def test_resnet50_trains_pipelined_like_eager(capture: str) -> None:
    model = ResNetWithLoss()
    batch = {"images": torch.randn(28, 3, 32, 32), "labels": torch.randint(0, 10, (28,))}
    strategy = execution_strategy("pipelined")
    runner = check_training(
        model, batch, lambda o: (o[1], o[0]), strategy, ga=7, micro=4, capture=capture
    )
    assert runner.program.meta["capture"] == f"torch.{capture}"
    assert [s.ipu for s in runner.program.stages] == [0, 1, 2, 3]


def test_resnet50_infers_sharded_like_eager() -> None:
    batch = {"images": torch.randn(8, 3, 32, 32), "labels": torch.randint(0, 10, (8,))}
    check_inference(
        ResNetWithLoss(), batch, lambda o: o[0], execution_strategy("sharded"), di=2, micro=4
    )
