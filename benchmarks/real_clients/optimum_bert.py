"""optimum-graphcore's pipelined BERT and transformers' BERT placed as it places it, against eager.

Run inside an environment that has optimum-graphcore 0.7.1 and its pinned transformers (see
``run.py``). For 2 and 4 IPUs: ``PipelinedBertForSequenceClassification.parallelize()`` with the
options ``IPUConfig.to_options()`` makes, and a plain ``BertForSequenceClassification`` with
``poptorch.BeginBlock`` placed the same way (embeddings on IPU 0, layers spread, the classifier on
the last IPU, a recomputation checkpoint after every layer but the last). Each trains a few steps
with gradient accumulation; losses and weights are compared with the eager loop. Prints one JSON
line per case and exits 1 if any differs by more than the tolerance.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
import transformers
from optimum.graphcore import IPUConfig
from optimum.graphcore.models.bert.modeling_bert import PipelinedBertForSequenceClassification

import poptorch

LAYERS, HIDDEN, SEQ, MICRO, GA, STEPS, LR = 4, 64, 16, 2, 8, 3, 0.05  # GA >= 2 * 4 - 1
TOLERANCE = 1e-4


def _eager_model() -> transformers.BertForSequenceClassification:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=4 * HIDDEN,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
        return_dict=False,
    )
    return transformers.BertForSequenceClassification(config)


def _batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    rows = MICRO * GA
    return [
        {
            "input_ids": torch.randint(0, 1000, (rows, SEQ), generator=g),
            "attention_mask": (torch.rand(rows, SEQ, generator=g) > 0.2).long(),
            "labels": torch.randint(0, 2, (rows,), generator=g),
        }
        for _ in range(STEPS)
    ]


def _eager(model: torch.nn.Module, batches: list) -> list[float]:
    """The oracle: GA micro-batches, mean-reduced gradients (``ReductionType.Mean``), one step."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for batch in batches:
        opt.zero_grad()
        for i in range(GA):
            micro = {k: v[i * MICRO : (i + 1) * MICRO] for k, v in batch.items()}
            loss = model(**micro)[0]
            (loss / GA).backward()
            losses.append(loss.item())
        opt.step()
    return losses


def _layer_ipu(ipus: int) -> list[int]:
    return [i * ipus // LAYERS for i in range(LAYERS)]


def _placed_by_hand(model: transformers.BertForSequenceClassification, ipus: int) -> None:
    """BeginBlocks and recomputation checkpoints where ``BertPipelineMixin.parallelize`` puts them."""
    bert = model.bert
    bert.embeddings = poptorch.BeginBlock(bert.embeddings, "Embedding", ipu_id=0)
    for index, ipu in enumerate(_layer_ipu(ipus)):
        layer = bert.encoder.layer[index]
        if index != LAYERS - 1:
            layer.register_forward_hook(
                lambda _m, _i, out: tuple(poptorch.recomputationCheckpoint(y) for y in out)
            )
        bert.encoder.layer[index] = poptorch.BeginBlock(layer, f"Encoder{index}", ipu_id=ipu)
    model.classifier = poptorch.BeginBlock(model.classifier, "Classifier Output", ipu_id=ipus - 1)


def _ipu_config(ipus: int) -> IPUConfig:
    return IPUConfig(
        layers_per_ipu=[LAYERS // ipus] * ipus,
        recompute_checkpoint_every_layer=True,
        gradient_accumulation_steps=GA,
        device_iterations=1,
        output_mode="all",
        executable_cache_dir="disabled",
    )


def _pipelined(model: torch.nn.Module, opts: poptorch.Options, batches: list) -> list[float]:
    trainer = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=LR))
    losses = []
    for batch in batches:
        loss = trainer(**batch)[0]
        losses.extend(loss.reshape(-1).tolist())
    trainer.copyWeightsToHost()
    trainer.destroy()
    return losses


def _case(name: str, ipus: int, batches: list) -> dict:
    reference = _eager_model()
    model = copy.deepcopy(reference)
    config = _ipu_config(ipus)
    if name == "optimum":
        model = PipelinedBertForSequenceClassification.from_transformers(model, config)
        model.parallelize()
    else:
        _placed_by_hand(model, ipus)
    eager_losses = _eager(reference, batches)
    losses = _pipelined(model, config.to_options(), batches)
    if name == "optimum":
        model.deparallelize()
    ours = dict(model.named_parameters())
    weights = max((p - ours[n]).abs().max().item() for n, p in reference.named_parameters())
    loss = max(abs(a - b) for a, b in zip(eager_losses, losses, strict=True))
    ok = loss <= TOLERANCE and weights <= TOLERANCE and len(losses) == STEPS * GA
    return {"case": name, "ipus": ipus, "loss_diff": loss, "weight_diff": weights, "ok": ok}


def main() -> int:
    batches = _batches()
    results = []
    for name in ("optimum", "transformers"):
        for ipus in (2, 4):
            try:
                result = _case(name, ipus, batches)
            except Exception as error:  # noqa: BLE001  (report every case)
                result = {"case": name, "ipus": ipus, "ok": False, "error": repr(error)[:2000]}
            print(json.dumps(result), flush=True)
            results.append(result)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
