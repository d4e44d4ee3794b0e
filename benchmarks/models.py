"""The real-model scoreboard: each model split over IPUs against eager PyTorch on all cores.

Rows: BERT, GPT-2 (its default config: ``use_cache=True``, a ``DynamicCache`` in the outputs),
T5 (encoder-decoder), ViT, ResNet-50 (blocks on ``layer1``-``layer4``, and PopRT's manual cut)
and a Llama-style ``LlamaForCausalLM``; each pipelined and sharded, training and inference.

* training: one ``trainingModel`` call = ``GA`` micro-batches forward + backward and one SGD
  step. Eager: the same micro-batches on the main thread, ``loss / GA`` backward each, one step.
  BatchNorm (ResNet-50) is in training mode: each micro-batch is normalised by its own
  statistics, as on IPUs, and eager sees the same micro-batches in the same order.
* inference: one ``inferenceModel`` call of ``DI`` micro-batches. Eager: the same micro-batches
  under ``torch.no_grad()``, each one's outputs kept until the call returns (the simulated call
  returns every micro-batch's outputs; a loop that dropped them would reuse one micro-batch's
  memory, still in cache, where the call must write all of them).
* eager runs with every core (``torch.set_num_threads(cores)``); poptorch_sim's IPU workers
  share the same cores (see [Note: cores follow the work] in ``runtime/cores.py``).
* each row: warm-up calls (the first compiles; then a pipeline's trial of its ways to share the
  cores: split and lent, the first micro-batches of a call on one thread and, for inference,
  side by side; a sharded inference program's trial: one thread, its first micro-batches side
  by side), then ``--steps`` interleaved pairs (poptorch_sim, eager);
  medians of the times, and of each pair's ratio with the pairs' range (eager alone moves by
  10-30% between calls on a shared two-core machine). ``eager / sim`` above 1 means the
  simulated IPUs were faster than plain PyTorch.
* the machine's thread ceiling: how much faster the same matmuls ran on all cores than on one
  (a quiet two-core machine gives about 2; a loaded one less), and per model the same ratio of
  its eager training step.

Run: ``python benchmarks/models.py [--quick] [--steps N] [--only gpt2,bert]``
(``--quick`` uses tiny configs: a minute or two on two cores; ``--only resnet50`` selects both
ResNet-50 placements, ``resnet50-poprt`` only PopRT's cut.)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import transformers  # noqa: E402

try:
    from torchvision.models.resnet import Bottleneck, ResNet
except ImportError:  # the ResNet-50 rows are left out
    Bottleneck = ResNet = None  # type: ignore[assignment,misc]

import poptorch_sim as poptorch  # noqa: E402
from poptorch_sim.executor import placement  # noqa: E402
from poptorch_sim.runtime.cores import MODES, TRIAL_RUNS  # noqa: E402

Batch = dict[str, torch.Tensor]
AUTO, SAME = poptorch.AutoStage.AutoIncrement, poptorch.AutoStage.SameAsIpu
WARMUP = len(MODES) * TRIAL_RUNS  # calls after the first: a pipeline's trial
POPRT_CUT = {"add": 0, "layer4_0_bn3": 1, "add_13": 2}  # as benchmarks/sharding.py


@dataclass
class Size:
    hidden: int
    layers: int
    seq: int
    micro: int
    ga: int
    image: int
    vocab: float = 1.0  # of each model's default vocabulary (the LM heads' width)


QUICK = Size(hidden=64, layers=4, seq=16, micro=2, ga=4, image=32, vocab=0.02)
FULL = Size(hidden=256, layers=4, seq=128, micro=4, ga=10, image=64)


# -- models, blocks placed as optimum-graphcore places them ---------------------------------------
def _spread(layers: int, ipus: list[int]) -> list[int]:
    return [ipus[i * len(ipus) // layers] for i in range(layers)]


def bert(s: Size) -> nn.Module:
    config = transformers.BertConfig(
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.hidden // 64 or 1,
        intermediate_size=4 * s.hidden,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
        vocab_size=int(30522 * s.vocab),
    )
    model = transformers.BertForSequenceClassification(config)
    model.bert.embeddings = poptorch.BeginBlock(model.bert.embeddings, "Embedding", ipu_id=0)
    for i, ipu in enumerate(_spread(s.layers, [0, 1])):
        layer = model.bert.encoder.layer[i]
        model.bert.encoder.layer[i] = poptorch.BeginBlock(layer, f"Encoder{i}", ipu_id=ipu)
    model.classifier = poptorch.BeginBlock(model.classifier, "Classifier", ipu_id=1)
    return model


def gpt2(s: Size) -> nn.Module:
    """Default config but sizes and dropout: wte on IPU 0, layers on 1-3, tied head on IPU 0."""
    config = transformers.GPT2Config(
        n_embd=s.hidden,
        n_layer=s.layers,
        n_head=max(1, s.hidden // 64),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        vocab_size=int(50257 * s.vocab),
    )
    model = transformers.GPT2LMHeadModel(config)
    t = model.transformer
    t.wte = poptorch.BeginBlock(t.wte, "Token embedding", ipu_id=0)
    for i, ipu in enumerate(_spread(s.layers, [1, 2, 3])):
        t.h[i] = poptorch.BeginBlock(t.h[i], f"Layer{i}", ipu_id=ipu)
    model.lm_head = poptorch.BeginBlock(model.lm_head, "LM head", ipu_id=0)
    return model


def llama(s: Size) -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=s.hidden,
        intermediate_size=4 * s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=max(1, s.hidden // 64),
        num_key_value_heads=max(1, s.hidden // 128),
        max_position_embeddings=max(s.seq, 16),
        vocab_size=int(32000 * s.vocab),
    )
    model = transformers.LlamaForCausalLM(config)
    body = model.model
    body.embed_tokens = poptorch.BeginBlock(body.embed_tokens, "Embedding", ipu_id=0)
    for i, ipu in enumerate(_spread(s.layers, [1, 2, 3])):
        body.layers[i] = poptorch.BeginBlock(body.layers[i], f"Layer{i}", ipu_id=ipu)
    model.lm_head = poptorch.BeginBlock(model.lm_head, "LM head", ipu_id=0)
    return model


def t5(s: Size) -> nn.Module:
    config = transformers.T5Config(
        d_model=s.hidden,
        d_kv=64 if s.hidden >= 64 else s.hidden,
        d_ff=4 * s.hidden,
        num_layers=s.layers // 2,
        num_decoder_layers=s.layers // 2,
        num_heads=max(1, s.hidden // 64),
        dropout_rate=0.0,
        vocab_size=int(32128 * s.vocab),
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(config)
    enc, dec = model.encoder, model.decoder
    enc.embed_tokens = poptorch.BeginBlock(enc.embed_tokens, "Embedding", ipu_id=0)
    for i, ipu in enumerate(_spread(len(enc.block), [0, 1])):
        enc.block[i] = poptorch.BeginBlock(enc.block[i], f"Encoder{i}", ipu_id=ipu)
    dec.embed_tokens = poptorch.BeginBlock(dec.embed_tokens, "Decoder embedding", ipu_id=0)
    for i, ipu in enumerate(_spread(len(dec.block), [2, 3])):
        dec.block[i] = poptorch.BeginBlock(dec.block[i], f"Decoder{i}", ipu_id=ipu)
    model.lm_head = poptorch.BeginBlock(model.lm_head, "LM head", ipu_id=0)
    return model


def vit(s: Size) -> nn.Module:
    config = transformers.ViTConfig(
        image_size=s.image,
        patch_size=8,
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=max(1, s.hidden // 64),
        intermediate_size=4 * s.hidden,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=10,
    )
    model = transformers.ViTForImageClassification(config)
    model.vit.embeddings = poptorch.BeginBlock(model.vit.embeddings, "Embedding", ipu_id=0)
    layers = model.vit.layers if hasattr(model.vit, "layers") else model.vit.encoder.layer
    for i, ipu in enumerate(_spread(s.layers, [0, 1, 2, 3])):
        layers[i] = poptorch.BeginBlock(layers[i], f"Encoder{i}", ipu)
    model.classifier = poptorch.BeginBlock(model.classifier, "Head", ipu_id=3)
    return model


def resnet50(blocks: bool) -> nn.Module:
    """torchvision's ResNet-50 (its node names) returning ``(logits, loss)`` given labels;
    blocks on ``layer1``-``layer4`` unless it is to be cut by node name."""

    class ResNet50(ResNet):  # type: ignore[misc,valid-type]
        def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
            logits = super().forward(pixel_values)
            if labels is None:
                return logits
            return logits, nn.functional.cross_entropy(logits, labels)

    model = ResNet50(Bottleneck, [3, 4, 6, 3], num_classes=10)
    if blocks:
        for i in range(4):
            poptorch.BeginBlock(getattr(model, f"layer{i + 1}"), f"layer{i + 1}", i)
    return model


# -- batches and losses ---------------------------------------------------------------------------
def tokens(n: int, s: Size, vocab: int, labels: str) -> Batch:
    vocab = int(vocab * s.vocab)
    ids = torch.randint(0, vocab, (n, s.seq))
    batch = {"input_ids": ids, "attention_mask": torch.ones(n, s.seq, dtype=torch.long)}
    if labels == "tokens":
        batch["labels"] = ids.clone()
    elif labels == "classes":
        batch["labels"] = torch.randint(0, 2, (n,))
    else:  # a target sequence of a quarter the length
        batch["labels"] = torch.randint(0, vocab, (n, max(4, s.seq // 4)))
    return batch


def images(n: int, s: Size) -> Batch:
    return {
        "pixel_values": torch.randn(n, 3, s.image, s.image),
        "labels": torch.randint(0, 10, (n,)),
    }


def loss_of(out: Any) -> torch.Tensor:
    return out[1] if isinstance(out, tuple) else out.loss


@dataclass
class Case:
    name: str
    build: Callable[[Size], nn.Module]
    batch: Callable[[int, Size], Batch]
    stage: Any = SAME
    stages: int = 4  # forward pipeline stages: pipelined training needs GA >= 2 * stages - 1
    cut: dict[str, int] | None = None  # PopRT's manual sharding by node name
    targets: str | None = None  # in inference, what the training labels are passed as
    eager_as: str | None = None  # the case whose eager model this is (one ceiling for both)


CASES = {
    "gpt2": Case("GPT-2", gpt2, lambda n, s: tokens(n, s, 50257, "tokens"), AUTO, 5),
    "bert": Case("BERT", bert, lambda n, s: tokens(n, s, 30522, "classes"), SAME, 2),
    "llama": Case("Llama", llama, lambda n, s: tokens(n, s, 32000, "tokens"), AUTO, 5),
    "t5": Case(
        "T5", t5, lambda n, s: tokens(n, s, 32128, "targets"), AUTO, 6, targets="decoder_input_ids"
    ),
    "vit": Case("ViT", vit, images),
    "resnet50": Case("ResNet-50 blocks", lambda s: resnet50(True), images),
    "resnet50-poprt": Case(
        "ResNet-50 PopRT cut",
        lambda s: resnet50(False),
        images,
        cut=POPRT_CUT,
        eager_as="resnet50",
    ),
}


# -- timing ---------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def micro_batches(batch: Batch, count: int) -> list[Batch]:
    size = len(next(iter(batch.values()))) // count
    return [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(count)]


def eager_call(model: nn.Module, batch: Batch, count: int, training: bool) -> Callable[[], Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    parts = micro_batches(batch, count)

    def train() -> None:
        optimizer.zero_grad()
        for mb in parts:
            (loss_of(model(**mb)) / count).backward()
        optimizer.step()

    def infer() -> list[Any]:
        with torch.no_grad():
            return [model(**mb) for mb in parts]  # kept, as an inference call returns them all

    return train if training else infer


def sim_call(case: Case, model: nn.Module, batch: Batch, s: Size, strategy: str, training: bool):
    opts = poptorch.Options()
    if strategy == "sharded":
        opts.setExecutionStrategy(poptorch.ShardedExecution(case.stage))
    else:
        opts.setExecutionStrategy(poptorch.PipelinedExecution(case.stage))
    if case.cut is not None:  # the split points' devices and stages replace any blocks
        first = micro_batches(batch, s.ga)[0]
        poptorch.Sharder(case.cut, case.cut).run(model, **first)
    opts.showCompilationProgressBar(False)
    if training:
        opts.Training.gradientAccumulation(s.ga)
        sim = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-4))
    else:
        opts.deviceIterations(s.ga)
        sim = poptorch.inferenceModel(model.eval(), opts)
    return (lambda: sim(**batch)), sim


def row(
    case: Case,
    s: Size,
    strategy: str,
    training: bool,
    steps: int,
    cores: int,
    warmup: int,
    trials: bool = False,
) -> None:
    s = dataclasses.replace(s, ga=max(s.ga, 2 * case.stages - 1))
    torch.manual_seed(0)
    model = case.build(s)
    eager_model = copy.deepcopy(model)
    n = s.micro * s.ga
    batch = case.batch(n, s)
    if not training:
        labels = batch.pop("labels")
        if case.targets is not None:
            batch[case.targets] = labels
        eager_model.eval()
    eager = eager_call(eager_model, batch, s.ga, training)
    call, sim = sim_call(case, model, batch, s, strategy, training)
    first = timed(call)
    trial: dict[str, list[float]] = {}
    trying = strategy == "pipelined" or not training  # sharded inference: side by side
    for _ in range(warmup):  # a pipeline's trial (see [Note: cores follow the work])
        mode = placement(sim).mode if trying else "warm-up"
        trial.setdefault(mode, []).append(timed(call))
    torch.set_num_threads(cores)
    eager()
    sims, eagers = [], []
    for _ in range(steps):
        sims.append(timed(call))
        eagers.append(timed(eager))
    placed = placement(sim)
    split = placed.cores if placed.staged else "one program (not split)"
    ipus = list(placed.stage_ipus)
    sim.destroy()
    p, e = statistics.median(sims), statistics.median(eagers)
    ratios = [eager / sim for sim, eager in zip(sims, eagers)]
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    kind = "train" if training else "infer"
    print(
        f"| {case.name} | {kind} | {strategy} | {p * 1e3:,.0f} | {e * 1e3:,.0f} | "
        f"{statistics.median(ratios):.2f}{spread} | "
        f"{first:.1f} | IPUs {ipus}: {split} |" + (f" {trial_times(trial)} |" if trials else ""),
        flush=True,
    )


def trial_times(trial: dict[str, list[float]]) -> str:
    """The warm-up calls' times by the mode a pipeline's trial ran them in."""
    return "; ".join(
        f"{mode} " + " / ".join(f"{t * 1e3:,.0f}" for t in times) for mode, times in trial.items()
    )


def ceiling(cores: int, size: int = 512, repeats: int = 5) -> float:
    """How much faster the same matmuls run on ``cores`` threads than on one (medians)."""
    a = torch.randn(size, size)

    def work() -> None:
        for _ in range(32):
            a @ a

    ratios = []
    for _ in range(repeats):
        torch.set_num_threads(1)
        one = timed(work)
        torch.set_num_threads(cores)
        ratios.append(one / timed(work))
    return statistics.median(ratios)


def model_ceiling(case: Case, s: Size, cores: int) -> float:
    """The eager training step of ``case`` on one thread over on all cores (median of 3)."""
    torch.manual_seed(0)
    model = case.build(s)
    step = eager_call(model, case.batch(s.micro * s.ga, s), s.ga, True)
    step()
    ratios = []
    for _ in range(3):
        torch.set_num_threads(1)
        one = timed(step)
        torch.set_num_threads(cores)
        ratios.append(one / timed(step))
    return statistics.median(ratios)


def selected(only: str) -> list[str]:
    """The cases ``--only`` names: ``resnet50`` also selects ``resnet50-poprt``.

    Raises:
        SystemExit: a name that is no case's.
    """
    if not only:
        return list(CASES)
    names = []
    for wanted in only.split(","):
        found = [n for n in CASES if n == wanted or n.startswith(f"{wanted}-")]
        if not found:
            raise SystemExit(f"--only {wanted!r}: not one of {', '.join(CASES)}")
        names += [n for n in found if n not in names]
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny configs (a minute or two)")
    parser.add_argument("--steps", type=int, default=3, help="timed pairs per row (default 3)")
    parser.add_argument("--only", default="", help=f"comma-separated of {', '.join(CASES)}")
    parser.add_argument("--strategies", default="pipelined,sharded")
    parser.add_argument("--kinds", default="train,infer")
    parser.add_argument(
        "--trials",
        action="store_true",
        help="a column with the warm-up calls' times by trial mode (split, lent, one thread, "
        "side by side)",
    )
    parser.add_argument(
        "--no-model-ceilings", action="store_true", help="skip each model's 1-thread eager steps"
    )
    for field in ("hidden", "layers", "seq", "micro", "ga", "image"):
        parser.add_argument(f"--{field}", type=int, help=f"override the size's {field}")
    args = parser.parse_args()
    s = QUICK if args.quick else FULL
    overrides = {f: getattr(args, f) for f in ("hidden", "layers", "seq", "micro", "ga", "image")}
    s = dataclasses.replace(s, **{f: v for f, v in overrides.items() if v is not None})
    steps = 1 if args.quick else args.steps
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    torch.set_num_threads(cores)
    names = selected(args.only)
    if ResNet is None:
        print("torchvision is not installed: no ResNet-50 rows")
        names = [n for n in names if not n.startswith("resnet")]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {cores} cores")
    speedup = ceiling(cores, repeats=1 if args.quick else 5)
    print(f"thread ceiling: 512x512 matmuls ran {speedup:.2f}x as fast on {cores} threads as on 1")
    print(
        f"hidden {s.hidden}, {s.layers} layers, sequence {s.seq}, images {s.image}x{s.image}, "
        f"micro-batch {s.micro}, GA (training) / DI (inference) {s.ga} (at least 2 x stages - 1)"
        f"; medians of {steps}"
    )
    extra = (" trial ms |", "---|") if args.trials else ("", "")
    print(
        "| model | kind | strategy | sim ms | eager ms | eager / sim (pairs) | first call s | split |"
        + extra[0]
    )
    print("|---|---|---|---|---|---|---|---|" + extra[1])
    for name in names:
        case = CASES[name]
        for kind in args.kinds.split(","):
            for strategy in args.strategies.split(","):
                warmup = 0 if args.quick else WARMUP
                row(case, s, strategy, kind == "train", steps, cores, warmup, args.trials)
    for name in [] if args.no_model_ceilings else names:
        if CASES[name].eager_as in names:
            continue  # the same eager model as that case's: its ceiling is printed once
        print(
            f"{CASES[name].name}: eager training ran {model_ceiling(CASES[name], s, cores):.2f}x "
            f"as fast on {cores} threads as on 1",
            flush=True,
        )


if __name__ == "__main__":
    main()
