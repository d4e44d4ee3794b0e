"""transformers models with their default configs (``use_cache=True``: caches in the outputs),
split over IPUs, pipelined and sharded, training and inference, against eager PyTorch: a
Llama-style decoder (``LlamaForCausalLM``), T5 (encoder-decoder, ``EncoderDecoderCache``) and
``ViTForImageClassification``. Each config is tiny so that each test takes seconds."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from model_checks import (
    check_inference,
    check_training,
    execution_strategy,
    per_sample,
    stage_map,
    text_batch,
)
from torch import nn

import poptorch_sim as poptorch

transformers = pytest.importorskip("transformers")


# -- the models -----------------------------------------------------------------------------------
def llama() -> nn.Module:
    """Llama-style decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU): the
    embedding on IPU 0, decoder layer i on IPU i + 1, the final norm and LM head on IPU 3."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    model = transformers.LlamaForCausalLM(config)
    body = model.model
    body.embed_tokens = poptorch.BeginBlock(body.embed_tokens, "Embedding", ipu_id=0)
    for i, layer in enumerate(body.layers):
        body.layers[i] = poptorch.BeginBlock(layer, f"Layer{i}", ipu_id=i + 1)
    model.lm_head = poptorch.BeginBlock(model.lm_head, "LM head", ipu_id=3)
    return model


def t5() -> nn.Module:
    """T5 with its tied embedding kept on IPU 0: the encoder's and the decoder's lookups and the
    LM head run there; encoder blocks on IPUs 0-1, decoder blocks on IPUs 2-3."""
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(config)
    assert model.lm_head.weight is model.decoder.embed_tokens.weight
    enc, dec = model.encoder, model.decoder
    enc.embed_tokens = poptorch.BeginBlock(enc.embed_tokens, "Embedding", ipu_id=0)
    for i, ipu in enumerate((0, 1)):
        enc.block[i] = poptorch.BeginBlock(enc.block[i], f"Encoder{i}", ipu_id=ipu)
    dec.embed_tokens = poptorch.BeginBlock(dec.embed_tokens, "Decoder embedding", ipu_id=0)
    for i, ipu in enumerate((2, 3)):
        dec.block[i] = poptorch.BeginBlock(dec.block[i], f"Decoder{i}", ipu_id=ipu)
    model.lm_head = poptorch.BeginBlock(model.lm_head, "LM head", ipu_id=0)
    return model


def vit() -> nn.Module:
    """ViT on 16 x 16 images of 4 x 4 patches: embeddings and layer 0 on IPU 0, layer i on IPU i,
    the classifier on IPU 3."""
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    model = transformers.ViTForImageClassification(config)
    model.vit.embeddings = poptorch.BeginBlock(model.vit.embeddings, "Embedding", ipu_id=0)
    for i, layer in enumerate(model.vit.layers):
        model.vit.layers[i] = poptorch.BeginBlock(layer, f"Encoder{i}", ipu_id=i)
    model.classifier = poptorch.BeginBlock(model.classifier, "Head", ipu_id=3)
    return model


def images(n: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(n, 3, 16, 16), "labels": torch.randint(0, 3, (n,))}


def seq2seq(n: int) -> dict[str, torch.Tensor]:
    return {**text_batch(n), "labels": torch.randint(1, 64, (n, 5))}


def _ga(strategy: str, stages: int) -> int:
    return 2 * stages - 1 if strategy == "pipelined" else 2


# -- Llama ----------------------------------------------------------------------------------------
_LLAMA_STAGES = [
    (0, ("Embedding",)),
    (1, ("Layer0",)),
    (2, ("Layer1",)),
    (3, ("Layer2", "LM head")),
]


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_llama_trains_like_eager(strategy: str) -> None:
    ga = _ga(strategy, 4)
    batch = text_batch(2 * ga)
    batch["labels"] = batch["input_ids"].clone()
    runner = check_training(
        llama(),
        batch,
        lambda o: (o.loss, per_sample(o.logits, o.past_key_values)),
        execution_strategy(strategy),
        ga=ga,
    )
    assert runner.program.meta["capture"] == "torch.export"
    assert stage_map(runner) == _LLAMA_STAGES


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_llama_infers_like_eager(strategy: str) -> None:
    runner = check_inference(
        llama(),
        text_batch(8),
        lambda o: per_sample(o.logits, o.past_key_values),
        execution_strategy(strategy),
        di=4,
    )
    assert stage_map(runner) == _LLAMA_STAGES


# -- T5 -------------------------------------------------------------------------------------------
def _t5_outputs(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return out.loss, per_sample(out.logits, out.encoder_last_hidden_state, out.past_key_values)


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_t5_trains_like_eager(strategy: str) -> None:
    ga = _ga(strategy, 6)
    runner = check_training(
        t5(), seq2seq(2 * ga), _t5_outputs, execution_strategy(strategy, True), ga=ga
    )
    assert [s.ipu for s in runner.program.stages] == [0, 1, 0, 2, 3, 0]
    embedding, head = runner.program.stages[0].module, runner.program.stages[-1].module
    tied = {id(p) for p in embedding.parameters()} & {id(p) for p in head.parameters()}
    assert len(tied) == 1  # shared.weight: both lookups and the LM head, all on IPU 0


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_t5_infers_like_eager(strategy: str) -> None:
    batch = text_batch(12)
    batch["decoder_input_ids"] = torch.randint(0, 64, (12, 5))
    check_inference(
        t5(),
        batch,
        lambda o: per_sample(o.logits, o.encoder_last_hidden_state, o.past_key_values),
        execution_strategy(strategy, True),
        di=6,
    )


# -- ViT ------------------------------------------------------------------------------------------
_VIT_STAGES = [
    (0, ("Embedding", "Encoder0")),
    (1, ("Encoder1",)),
    (2, ("Encoder2",)),
    (3, ("Encoder3", "Head")),
]


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_vit_trains_like_eager(strategy: str) -> None:
    ga = _ga(strategy, 4)
    runner = check_training(
        vit(), images(2 * ga), lambda o: (o.loss, o.logits), execution_strategy(strategy), ga=ga
    )
    assert runner.program.meta["capture"] == "torch.export"
    assert stage_map(runner) == _VIT_STAGES


@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_vit_infers_like_eager(strategy: str) -> None:
    batch = images(8)
    del batch["labels"]
    runner = check_inference(vit(), batch, lambda o: o.logits, execution_strategy(strategy), di=4)
    assert stage_map(runner) == _VIT_STAGES
