"""Graphcore's published MLPerf Training configurations, built on the meta device.

Each ``Published`` row builds its model with nothing allocated, its options and one call's
inputs (shapes only), as the audited runs had them (MLPerf Training v1.0 and v1.1, closed
division, IPU-POD16 (Mk2); the configurations are in the mlcommons training_results
repositories, and the applications in graphcore/examples), and ``compile_published`` compiles it
offline (``poptorch_sim.offline.compile_offline``) so that its reports can be read::

    from published import CONFIGURATIONS, compile_published   # benchmarks/ on sys.path
    model = compile_published(CONFIGURATIONS[0])
    print(poptorch_sim.memory_report(model)); model.destroy()

BERT-Large: transformers' ``BertForPreTraining`` (hidden 1024, 24 layers, 16 heads, 4096 wide,
sequence 512), in FP16 with FP16 partials, as Graphcore's pipelined BERT runs it: blocks
[3, 7, 7, 7] layers on IPUs 0-3 with the embedding on IPU 0 and the pooler and heads back on
IPU 0 (beside the word embedding the MLM decoder is tied to), every layer's output a
recomputation checkpoint, the MLM head on the 76 masked positions of each sequence only,
LAMB with FP16 gradient accumulators and FP32 moments kept off chip and sharded across the 4
replicas (RTS). Micro-batch 2, gradient accumulation 192. The runs used packed sequences (up to
3 per row of 512 tokens): packing changes the attention mask and the labels, not the shapes
that fill an IPU, so the rows here are unpacked sequences of 512 tokens; a "sample" is a pack.
Attention is transformers' eager implementation (matmul, softmax, matmul: what an IPU runs),
without dropout on the attention probabilities (Graphcore's setting), hidden dropout 0.1.

ResNet-50 v1.5: ``torchvision.models.resnet50`` in FP16 with FP16 partials, one IPU per
replica, 16 replicas, micro-batch 20, gradient accumulation 6 (v1.0) or 10 (v1.1), SGD with
momentum as one combined accumulator per weight (PopART's SGD1, Graphcore's
``sgd_combined``), RecomputeAll with Graphcore's checkpoints (after the residual additions of
blocks 0-3, 5-7, 9 and 11-15 and after every convolution and norm of ``layer4``, the pool and
the classifier).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.offline import compile_offline

__all__ = ["CONFIGURATIONS", "Published", "bert_large", "compile_published", "resnet50"]

BERT_LAYERS_PER_IPU = (3, 7, 7, 7)
BERT_MASKED_TOKENS = 76  # per sequence of 512 (Graphcore's mask_tokens for sequence 512)
# Graphcore's recompute_checkpoints for ResNet-50 on one IPU: residual additions by block
# (``add``, ``add_1``, ... in order) and every module of layer4, the pool and the classifier.
RESNET_MARKED_BLOCKS = (0, 1, 2, 3, 5, 6, 7, 9, 11, 12, 13, 14, 15)


@dataclass(frozen=True)
class Published:
    """One published configuration and how to build it on the meta device.

    Attributes:
        name: the row's name.
        source: round and system of the published result.
        published: the published throughput, in ``unit``.
        unit: what a sample is.
        build: the model, built on the meta device by ``compile_published``.
        options: its ``poptorch.Options`` (offline).
        inputs: one call's keyword inputs, on the meta device.
        optimizer: the optimizer, from the model's parameters.
    """

    name: str
    source: str
    published: float
    unit: str
    build: Callable[[], nn.Module]
    options: Callable[[], poptorch.Options]
    inputs: Callable[[], dict[str, torch.Tensor]]
    optimizer: Callable[[Any], torch.optim.Optimizer]


def compile_published(config: Published) -> poptorch.PoplarExecutor:
    """Build ``config`` on the meta device and compile it offline (``destroy()`` it after)."""
    return compile_offline(
        config.build, config.options(), optimizer=config.optimizer, **config.inputs()
    )


# -- BERT-Large ----------------------------------------------------------------------------------
class BertPretraining(nn.Module):
    """``BertForPreTraining`` with Graphcore's MLM head: only the masked positions are
    projected onto the vocabulary; one loss (MLM + NSP)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        import transformers

        self.model = transformers.BertForPreTraining(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        masked_lm_positions: torch.Tensor,
        masked_lm_labels: torch.Tensor,
        next_sentence_label: torch.Tensor,
    ) -> torch.Tensor:
        sequence, pooled = self.model.bert(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
            return_dict=False,
        )[:2]  # fmt: skip
        index = masked_lm_positions.unsqueeze(-1).expand(-1, -1, sequence.shape[-1])
        scores, nsp = self.model.cls(torch.gather(sequence, 1, index), pooled)
        mlm = F.cross_entropy(
            scores.flatten(0, 1).float(), masked_lm_labels.flatten(), ignore_index=0
        )
        loss = mlm + F.cross_entropy(nsp.float(), next_sentence_label)
        return poptorch.identity_loss(loss, reduction="none")


def _mark_output(module: nn.Module, inputs: Any, output: Any) -> Any:
    if isinstance(output, tuple):
        return tuple(
            poptorch.recomputationCheckpoint(o) if isinstance(o, torch.Tensor) else o
            for o in output
        )
    return poptorch.recomputationCheckpoint(output)


def bert_large_model(layers: int = 24, hidden: int = 1024) -> nn.Module:
    """BERT-Large for pre-training, FP16, placed as Graphcore's pipelined BERT."""
    import transformers

    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=16,
        intermediate_size=4 * hidden, max_position_embeddings=512,
        attention_probs_dropout_prob=0.0, attn_implementation="eager",
    )  # fmt: skip
    net = BertPretraining(config).half()
    bert = net.model.bert
    bert.embeddings = poptorch.BeginBlock(bert.embeddings, "Embedding", ipu_id=0)
    split = [ipu for ipu, n in enumerate(_split(layers)) for _ in range(n)]
    for k, ipu in enumerate(split):
        bert.encoder.layer[k].register_forward_hook(_mark_output)
        bert.encoder.layer[k] = poptorch.BeginBlock(bert.encoder.layer[k], f"Encoder{k}", ipu)
    bert.pooler = poptorch.BeginBlock(bert.pooler, "Pooler", ipu_id=0)
    net.model.cls = poptorch.BeginBlock(net.model.cls, "Classifier", ipu_id=0)
    return net


def _split(layers: int) -> tuple[int, ...]:
    if layers == sum(BERT_LAYERS_PER_IPU):
        return BERT_LAYERS_PER_IPU
    return (1, *([(layers - 1) // 3] * 3))  # smaller test models: one layer on IPU 0


def bert_options(replicas: int = 4, gradient_accumulation: int = 192) -> poptorch.Options:
    """Graphcore's BERT options: pipelined, FP16 partials, LAMB state off chip with RTS."""
    opts = poptorch.Options().useOfflineIpuTarget()
    opts.replicationFactor(replicas)
    opts.Training.gradientAccumulation(gradient_accumulation)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
    opts.outputMode(poptorch.OutputMode.Sum)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False).useReplicatedTensorSharding(True)
    )
    opts.Precision.enableStochasticRounding(True)
    opts.Precision.setPartialsType(torch.float16)
    return opts


def bert_inputs(rows: int, sequence: int = 512) -> dict[str, torch.Tensor]:
    """One call's inputs (``rows`` sequences), on the meta device."""
    ids = torch.empty(rows, sequence, dtype=torch.long, device="meta")
    masked = torch.empty(rows, BERT_MASKED_TOKENS, dtype=torch.long, device="meta")
    return dict(
        input_ids=ids, attention_mask=ids, token_type_ids=ids, masked_lm_positions=masked,
        masked_lm_labels=masked,
        next_sentence_label=torch.empty(rows, dtype=torch.long, device="meta"),
    )  # fmt: skip


def lamb(params: Any) -> torch.optim.Optimizer:
    """Graphcore's LAMB for BERT: FP16 gradient accumulators, FP32 moments."""
    return poptorch.optim.LAMB(
        params, lr=0.006, eps=1e-6, weight_decay=0.01, bias_correction=False,
        loss_scaling=128.0, accum_type=torch.float16,
        first_order_momentum_accum_type=torch.float32,
        second_order_momentum_accum_type=torch.float32,
    )  # fmt: skip


def bert_large(source: str, published: float) -> Published:
    """MLPerf's BERT-Large on an IPU-POD16: 4 replicas of 4 IPUs, micro-batch 2, GA 192."""
    return Published(
        "BERT-Large mb 2 GA 192 x4 [3,7,7,7]", source, published, "sequences/s",
        bert_large_model, bert_options, lambda: bert_inputs(2 * 192 * 4), lamb,
    )  # fmt: skip


# -- ResNet-50 -----------------------------------------------------------------------------------
class ResNetTraining(nn.Module):
    """``torchvision.models.resnet50`` with a loss and Graphcore's recomputation checkpoints."""

    def __init__(self) -> None:
        super().__init__()
        import torchvision

        self.net = torchvision.models.resnet50()
        blocks = [b for layer in (1, 2, 3, 4) for b in getattr(self.net, f"layer{layer}")]
        marked = [blocks[i] for i in RESNET_MARKED_BLOCKS]
        marked += [
            m for m in self.net.layer4.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))
        ]
        for module in [*marked, self.net.avgpool, self.net.fc]:
            module.register_forward_hook(_mark_output)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        out = self.net(images)
        return out, F.cross_entropy(out.float(), labels, label_smoothing=0.1)


def resnet_options(gradient_accumulation: int, replicas: int = 16) -> poptorch.Options:
    """Graphcore's ResNet-50 options: one IPU per replica, FP16 partials, RecomputeAll."""
    opts = poptorch.Options().useOfflineIpuTarget()
    opts.replicationFactor(replicas)
    opts.Training.gradientAccumulation(gradient_accumulation)
    opts.Precision.enableStochasticRounding(True)
    opts.Precision.setPartialsType(torch.float16)
    opts._Popart.set("autoRecomputation", 4)  # RecomputationType.RecomputeAll
    return opts


def resnet_inputs(rows: int, size: int = 224) -> dict[str, torch.Tensor]:
    """One call's inputs (``rows`` images), on the meta device."""
    return dict(
        images=torch.empty(rows, 3, size, size, dtype=torch.float16, device="meta"),
        labels=torch.empty(rows, dtype=torch.long, device="meta"),
    )


def sgd_combined(params: Any) -> torch.optim.Optimizer:
    """SGD with momentum in one combined accumulator (PopART's SGD1)."""
    return poptorch.optim.SGD(
        params, lr=2.0, momentum=0.9, weight_decay=1e-4, loss_scaling=128.0,
        use_combined_accum=True,
    )  # fmt: skip


def resnet50(source: str, published: float, gradient_accumulation: int) -> Published:
    """MLPerf's ResNet-50 v1.5 on an IPU-POD16: 16 replicas of 1 IPU, micro-batch 20."""
    return Published(
        f"ResNet-50 mb 20 GA {gradient_accumulation} x16", source, published, "images/s",
        lambda: ResNetTraining().half(), lambda: resnet_options(gradient_accumulation),
        lambda: resnet_inputs(20 * gradient_accumulation * 16), sgd_combined,
    )  # fmt: skip


CONFIGURATIONS = [
    bert_large("MLPerf Training v1.0, IPU-POD16 (Mk2)", 1419.0),
    bert_large("MLPerf Training v1.1, IPU-POD16 (Mk2)", 1524.0),
    resnet50("MLPerf Training v1.0, IPU-POD16 (Mk2)", 27527.0, 6),
    resnet50("MLPerf Training v1.1, IPU-POD16 (Mk2)", 29543.0, 10),
]
