"""Graphcore's published MLPerf Training configurations, built on the meta device.

Each ``Published`` row builds its model with nothing allocated, its options and one call's
inputs (shapes only), as the audited runs had them (``CONFIGURATIONS``: MLPerf Training
v1.0 and v1.1, closed division, IPU-POD16 (Mk2); the configurations are in the mlcommons
training_results repositories, and the applications in graphcore/examples), and
``compile_published`` compiles it offline (``poptorch_sim.offline.compile_offline``) so that
its reports can be read::

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

ResNet-50 v1.5: ``torchvision.models.resnet50`` in FP16 with FP16 partials, fed 8-bit images
that the IPU casts and normalises (``eight_bit_io``), one IPU per replica, 16 replicas,
micro-batch 20, gradient accumulation 6 (v1.0) or 10 (v1.1), SGD with momentum as one combined
accumulator per weight (PopART's SGD1, Graphcore's ``sgd_combined``), RecomputeAll with
Graphcore's checkpoints (after the residual additions of blocks 0-3, 5-7, 9 and 11-15 and after
every convolution and norm of ``layer4``, the pool and the classifier).

``VALIDATION``: the rows the time model is checked against and never fitted on (MLPerf
Training v1.0 and v1.1 on IPU-POD64 (Mk2), v2.0 on Bow Pod16 and Pod64), built by the same
functions with each run's own settings, each with the result logs and the configuration file it
comes from. BERT on 8 IPUs: the embedding alone on IPU 0 then ``layers_per_ipu`` [3,3,3,3,4,4,4]
(v1.0), or, from v1.1, Graphcore's ``att_ffn_placement``, which also cuts between an attention
and its feed-forward (``attention_ffn``: groups of the sequence attention 0, feed-forward 0,
attention 1, ...), the last group and the heads back on IPU 0; optimizer state on chip with
RTS, 8 (POD64) or 2 (Bow Pod16) replicas; v2.0 at micro-batch 3 with dropout on the attention
probabilities. Not modelled: v2.0 Pod16 stores its recomputation checkpoints in FP8 (memory,
not time); v1.1 and v2.0 ResNet-50 ran LARS (built here with SGD, as the v1.1 calibration row:
either is a few pointwise ops per weight once a step); every ResNet-50 run normalised its batches
across pairs of replicas (``BN_span`` 2); v1.0 IPU-POD64 ResNet-50 ran 16 host processes of 4
replicas each where every other ResNet-50 run has one per 2 replicas, each decoding its images
with 48 parallel calls (the host's input pipeline: no part of the compiled program).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.offline import compile_offline

__all__ = [
    "CONFIGURATIONS",
    "VALIDATION",
    "Published",
    "attention_ffn",
    "bert_large",
    "compile_published",
    "resnet50",
    "whole_layers",
]

BERT_LAYERS_PER_IPU = (3, 7, 7, 7)
BERT_MASKED_TOKENS = 76  # per sequence of 512 (Graphcore's mask_tokens for sequence 512)
# Graphcore's recompute_checkpoints for ResNet-50 on one IPU: residual additions by block
# (``add``, ``add_1``, ... in order) and every module of layer4, the pool and the classifier.
RESNET_MARKED_BLOCKS = (0, 1, 2, 3, 5, 6, 7, 9, 11, 12, 13, 14, 15)
# Graphcore's ImageNet normalisation on the IPU (``NORMALIZED_MEAN`` / ``NORMALIZED_STD``)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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
        results: where the published figure comes from (repository and folder of the result
            logs) and how it was derived from them.
        configuration: the file of the configuration the run used.
    """

    name: str
    source: str
    published: float
    unit: str
    build: Callable[[], nn.Module]
    options: Callable[[], poptorch.Options]
    inputs: Callable[[], dict[str, torch.Tensor]]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    results: str = ""
    configuration: str = ""


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


def bert_large_model(
    layers: int = 24,
    hidden: int = 1024,
    *,
    encoder: Sequence[tuple[int, int]] | None = None,
    attention_dropout: float = 0.0,
    vocab: int = 30522,
) -> nn.Module:
    """BERT-Large for pre-training, FP16, placed as Graphcore's pipelined BERT.

    Args:
        layers: encoder layers.
        hidden: hidden size.
        encoder: ``(IPU, sub-layers)`` per group of the encoder's sequence of sub-layers
            (attention 0, feed-forward 0, attention 1, ...), as Graphcore's ``att_ffn_placement``
            cuts it; default: whole layers, ``BERT_LAYERS_PER_IPU`` from IPU 0.
        attention_dropout: dropout on the attention probabilities (0: Graphcore's
            ``no_attn_dropout``).
        vocab: the vocabulary (Graphcore pads it: 30400 in v1.0, 30912 from v1.1).
    """
    import transformers

    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=16, intermediate_size=4 * hidden, max_position_embeddings=512,
        attention_probs_dropout_prob=attention_dropout, attn_implementation="eager",
    )  # fmt: skip
    net = BertPretraining(config).half()
    bert = net.model.bert
    bert.embeddings = poptorch.BeginBlock(bert.embeddings, "Embedding", ipu_id=0)
    groups = encoder if encoder is not None else whole_layers(_split(layers))
    placed = [ipu for ipu, n in groups for _ in range(n)]
    if len(placed) != 2 * layers:
        raise ValueError(f"encoder places {len(placed)} sub-layers, BERT has {2 * layers}")
    for k in range(layers):
        bert.encoder.layer[k].register_forward_hook(_mark_output)
        attention, feed_forward = placed[2 * k], placed[2 * k + 1]
        if feed_forward != attention:  # a cut inside the layer, before its feed-forward
            poptorch.BeginBlock(bert.encoder.layer[k].intermediate, f"Encoder{k}FF", feed_forward)
        bert.encoder.layer[k] = poptorch.BeginBlock(
            bert.encoder.layer[k], f"Encoder{k}", attention
        )
    bert.pooler = poptorch.BeginBlock(bert.pooler, "Pooler", ipu_id=0)
    net.model.cls = poptorch.BeginBlock(net.model.cls, "Classifier", ipu_id=0)
    return net


def whole_layers(layers_per_ipu: Sequence[int], first_ipu: int = 0) -> list[tuple[int, int]]:
    """``bert_large_model``'s ``encoder`` for whole layers per IPU (Graphcore's
    ``layers_per_ipu`` from ``encoder_start_ipu``)."""
    return [(first_ipu + i, 2 * n) for i, n in enumerate(layers_per_ipu)]


def attention_ffn(placement: Sequence[tuple[int, tuple[int, int]]]) -> list[tuple[int, int]]:
    """``bert_large_model``'s ``encoder`` for Graphcore's ``att_ffn_placement``: per pipeline
    stage, its IPU and how many attention and feed-forward sub-layers it runs, in order."""
    out, attentions, feed_forwards = [], 0, 0
    for ipu, (attention, feed_forward) in placement:
        attentions, feed_forwards = attentions + attention, feed_forwards + feed_forward
        if attentions - feed_forwards not in (0, 1):  # then a stage's sub-layers are not in a row
            raise ValueError(f"att_ffn_placement {list(placement)} does not cut the sub-layers "
                             "in order")  # fmt: skip
        out.append((ipu, attention + feed_forward))
    return out


def _split(layers: int) -> tuple[int, ...]:
    if layers == sum(BERT_LAYERS_PER_IPU):
        return BERT_LAYERS_PER_IPU
    return (1, *([(layers - 1) // 3] * 3))  # smaller test models: one layer on IPU 0


def bert_options(
    replicas: int = 4,
    gradient_accumulation: int = 192,
    *,
    off_chip: bool = True,
    ipu_version: int = 2,
) -> poptorch.Options:
    """Graphcore's BERT options: pipelined, FP16 partials, LAMB state sharded across the
    replicas (RTS) and kept off chip (``optimizer_state_offchip``) or on it."""
    opts = poptorch.Options().useOfflineIpuTarget(ipu_version)
    opts.replicationFactor(replicas)
    opts.Training.gradientAccumulation(gradient_accumulation)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
    opts.outputMode(poptorch.OutputMode.Sum)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings()
        .useOnChipStorage(not off_chip)
        .useReplicatedTensorSharding(True)
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


def bert_large(
    source: str,
    published: float,
    *,
    micro_batch: int = 2,
    gradient_accumulation: int = 192,
    replicas: int = 4,
    encoder: Sequence[tuple[int, int]] | None = None,
    off_chip: bool = True,
    ipu_version: int = 2,
    attention_dropout: float = 0.0,
    vocab: int = 30522,
    results: str = "",
    configuration: str = "",
) -> Published:
    """MLPerf's BERT-Large (default: on an IPU-POD16, 4 replicas of [3,7,7,7], micro-batch 2,
    GA 192, LAMB off chip)."""
    shape = (
        "[3,7,7,7]"
        if encoder is None
        else (
            f"{len({0} | {ipu for ipu, _ in encoder})} IPUs, sub-layers {[n for _, n in encoder]}"
        )
    )
    name = f"BERT-Large mb {micro_batch} GA {gradient_accumulation} x{replicas} {shape}"
    if encoder is not None or not off_chip or ipu_version != 2:
        name += f" v{ipu_version} {'off' if off_chip else 'on'} chip"

    def build() -> nn.Module:
        return bert_large_model(encoder=encoder, attention_dropout=attention_dropout,
                                vocab=vocab)  # fmt: skip

    def options() -> poptorch.Options:
        return bert_options(replicas, gradient_accumulation, off_chip=off_chip,
                            ipu_version=ipu_version)  # fmt: skip

    rows = micro_batch * gradient_accumulation * replicas
    return Published(
        name, source, published, "sequences/s", build, options, lambda: bert_inputs(rows), lamb,
        results, configuration,
    )  # fmt: skip


# -- ResNet-50 -----------------------------------------------------------------------------------
class ResNetTraining(nn.Module):
    """``torchvision.models.resnet50`` with a loss and Graphcore's recomputation checkpoints,
    fed 8-bit images that the IPU casts and normalises (Graphcore's ``eight_bit_io`` and
    ``fused_accelerator_side_preprocessing``: scale 1/255, ImageNet's mean and deviation)."""

    def __init__(self) -> None:
        super().__init__()
        import torchvision

        self.net = torchvision.models.resnet50()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(3, 1, 1))
        blocks = [b for layer in (1, 2, 3, 4) for b in getattr(self.net, f"layer{layer}")]
        marked = [blocks[i] for i in RESNET_MARKED_BLOCKS]
        marked += [
            m for m in self.net.layer4.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))
        ]
        for module in [*marked, self.net.avgpool, self.net.fc]:
            module.register_forward_hook(_mark_output)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        x = (images.to(self.mean.dtype) * (1.0 / 255.0) - self.mean) / self.std
        out = self.net(x)
        return out, F.cross_entropy(out.float(), labels, label_smoothing=0.1)


def resnet_options(
    gradient_accumulation: int, replicas: int = 16, ipu_version: int = 2
) -> poptorch.Options:
    """Graphcore's ResNet-50 options: one IPU per replica, FP16 partials, RecomputeAll."""
    opts = poptorch.Options().useOfflineIpuTarget(ipu_version)
    opts.replicationFactor(replicas)
    opts.Training.gradientAccumulation(gradient_accumulation)
    opts.Precision.enableStochasticRounding(True)
    opts.Precision.setPartialsType(torch.float16)
    opts._Popart.set("autoRecomputation", 4)  # RecomputationType.RecomputeAll
    return opts


def resnet_inputs(rows: int, size: int = 224) -> dict[str, torch.Tensor]:
    """One call's inputs (``rows`` 8-bit images, as ``eight_bit_io`` sends them), on the meta
    device."""
    return dict(
        images=torch.empty(rows, 3, size, size, dtype=torch.uint8, device="meta"),
        labels=torch.empty(rows, dtype=torch.long, device="meta"),
    )


def sgd_combined(params: Any) -> torch.optim.Optimizer:
    """SGD with momentum in one combined accumulator (PopART's SGD1)."""
    return poptorch.optim.SGD(
        params, lr=2.0, momentum=0.9, weight_decay=1e-4, loss_scaling=128.0,
        use_combined_accum=True,
    )  # fmt: skip


def resnet50(
    source: str,
    published: float,
    gradient_accumulation: int,
    *,
    replicas: int = 16,
    micro_batch: int = 20,
    ipu_version: int = 2,
    results: str = "",
    configuration: str = "",
) -> Published:
    """MLPerf's ResNet-50 v1.5: one IPU per replica (default: 16 replicas, micro-batch 20)."""
    name = f"ResNet-50 mb {micro_batch} GA {gradient_accumulation} x{replicas}"
    if ipu_version != 2:
        name += f" v{ipu_version}"
    return Published(
        name, source, published, "images/s", lambda: ResNetTraining().half(),
        lambda: resnet_options(gradient_accumulation, replicas, ipu_version),
        lambda: resnet_inputs(micro_batch * gradient_accumulation * replicas), sgd_combined,
        results, configuration,
    )  # fmt: skip


CONFIGURATIONS = [
    bert_large("MLPerf Training v1.0, IPU-POD16 (Mk2)", 1419.0),
    bert_large("MLPerf Training v1.1, IPU-POD16 (Mk2)", 1524.0),
    resnet50("MLPerf Training v1.0, IPU-POD16 (Mk2)", 27527.0, 6),
    resnet50("MLPerf Training v1.1, IPU-POD16 (Mk2)", 29543.0, 10),
]

# Rows the time model is checked against and never fitted on (benchmarks/ipu_time.py). Each
# figure is the median over the runs of each run's median rate, from the result logs of the
# repository named (the rule that gives the four rows above): ResNet-50 1,281,167 images per
# epoch over each epoch's ``epoch_start``-``epoch_stop`` time; BERT each training block's
# sequences (the rise of ``epoch_num`` at the evaluation after it) over its ``block_start``-
# ``block_stop`` time. ``benchmarks/published/mlperf_logs.py`` recomputes them from a clone.
_V10, _V11, _V20 = (f"mlcommons/training_results_v{v}" for v in ("1.0", "1.1", "2.0"))
_BERT_CONFIGS = "Graphcore/benchmarks/bert/implementations/popart/configs"
_RESNET_CONFIGS = "Graphcore/benchmarks/resnet/implementations/tensorflow/configs.yml"
# fmt: off
VALIDATION = [
    bert_large(
        "MLPerf Training v1.0, IPU-POD64 (Mk2)", 4241.0, gradient_accumulation=96, replicas=8,
        encoder=whole_layers((3, 3, 3, 3, 4, 4, 4), first_ipu=1), off_chip=False, vocab=30400,
        results=f"{_V10} Graphcore/results/ipu-pod64-POPART-closed/bert (10 runs)",
        configuration=f"{_V10} {_BERT_CONFIGS}/mk2/pod64-closed.json",
    ),
    bert_large(
        "MLPerf Training v1.1, IPU-POD64 (Mk2)", 4782.0, gradient_accumulation=96, replicas=8,
        encoder=attention_ffn([(1, (2, 2)), (2, (3, 3)), (3, (4, 3)), (4, (3, 4)),
                               (5, (4, 3)), (6, (3, 4)), (7, (4, 3)), (0, (1, 2))]),
        off_chip=False, vocab=30912,
        results=f"{_V11} Graphcore/results/ipu-pod64-POPART-closed/bert (10 runs)",
        configuration=f"{_V11} {_BERT_CONFIGS}/mk2/pod64-closed.json",
    ),
    bert_large(
        "MLPerf Training v2.0, Bow Pod16", 2304.0, micro_batch=3, gradient_accumulation=256,
        replicas=2,
        encoder=attention_ffn([(1, (3, 3)), (2, (4, 3)), (3, (3, 3)), (4, (3, 4)),
                               (5, (4, 3)), (6, (3, 4)), (7, (4, 3)), (0, (0, 1))]),
        off_chip=False, ipu_version=21, attention_dropout=0.1, vocab=30912,
        results=f"{_V20} Graphcore/results/ipu-pod16-POPART-closed/bert (10 runs)",
        configuration=f"{_V20} {_BERT_CONFIGS}/pod16-closed.json",
    ),
    bert_large(
        "MLPerf Training v2.0, Bow Pod64", 7418.0, micro_batch=3, gradient_accumulation=96,
        replicas=8,
        encoder=attention_ffn([(1, (3, 3)), (2, (3, 3)), (3, (3, 3)), (4, (4, 3)),
                               (5, (3, 4)), (6, (4, 3)), (7, (3, 4)), (0, (1, 1))]),
        off_chip=False, ipu_version=21, attention_dropout=0.1, vocab=30912,
        results=f"{_V20} Graphcore/results/ipu-pod64-POPART-closed/bert (10 runs)",
        configuration=f"{_V20} {_BERT_CONFIGS}/pod64-closed.json",
    ),
    resnet50(
        "MLPerf Training v1.0, IPU-POD64 (Mk2)", 83404.0, 2, replicas=64,
        results=f"{_V10} Graphcore/results/ipu-pod64-TF1/resnet (5 runs)",
        configuration=f"{_V10} {_RESNET_CONFIGS} (mk2_resnet50_mlperf_pod64_bs20)",
    ),
    resnet50(
        "MLPerf Training v1.1, IPU-POD64 (Mk2)", 108011.0, 3, replicas=64,
        results=f"{_V11} Graphcore/results/ipu-pod64-TF1/resnet (5 runs)",
        configuration=f"{_V11} {_RESNET_CONFIGS} (mk2_resnet50_mlperf_pod64_lars)",
    ),
    resnet50(
        "MLPerf Training v2.0, Bow Pod16", 43128.0, 10, micro_batch=22, ipu_version=21,
        results=f"{_V20} Graphcore/results/ipu-pod16-TF1-closed/resnet (5 runs)",
        configuration=f"{_V20} {_RESNET_CONFIGS} (mk2_resnet50_mlperf_pod16_lars)",
    ),
    resnet50(
        "MLPerf Training v2.0, Bow Pod64", 146253.0, 4, replicas=64, ipu_version=21,
        results=f"{_V20} Graphcore/results/ipu-pod64-TF1-closed/resnet (5 runs)",
        configuration=f"{_V20} {_RESNET_CONFIGS} (mk2_resnet50_mlperf_pod64_lars)",
    ),
]
# fmt: on
