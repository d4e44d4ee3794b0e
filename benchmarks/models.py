"""Real models on 4 simulated IPUs: per-step time against eager PyTorch, and compile time.

* step: one ``trainingModel`` call = ``GA`` micro-batches forward + backward through the
  pipeline and one optimizer step (SGD). The baseline is the same model in eager PyTorch on the
  main thread with every core (``torch.set_num_threads(os.cpu_count())``): the same ``GA``
  micro-batches, ``loss / GA`` backward each, one step; and the same on one thread (steadier
  than the all-cores figure when other processes hold cores). All are measured in the same run,
  interleaved, and reported as medians with their ratios.
* BERT: ``BertForSequenceClassification``, embeddings and encoder layers in blocks placed as
  optimum-graphcore places them (embeddings on IPU 0, layers spread over IPUs 0-3, the
  classifier on IPU 3), ``PipelinedExecution``.
* GPT-2: ``GPT2LMHeadModel`` with tied embeddings, layers on IPUs 1-3 and the LM head back on
  IPU 0 (5 pipeline stages, ``AutoStage.AutoIncrement``).
* compile: ``trainingModel(...).compile(...)`` of a BERT-base-sized model (12 layers, hidden 768,
  random init), and the capture (``torch.export``) alone.

Four IPU worker threads share the machine's cores, so on a two-core machine the pipeline cannot
beat eager PyTorch: the figures show what the simulation costs, not an IPU's speed.

Run: ``.venv/bin/python benchmarks/models.py [--quick] [--steps N]``
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import transformers  # noqa: E402

import poptorch_sim as poptorch  # noqa: E402
from poptorch_sim.compiler.capture import capture_model  # noqa: E402

Batch = dict[str, torch.Tensor]


def bert(layers: int, hidden: int, ipus: int = 4) -> nn.Module:
    """BertForSequenceClassification with optimum-graphcore's placement over ``ipus`` IPUs."""
    config = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    model = transformers.BertForSequenceClassification(config)
    model.bert.embeddings = poptorch.BeginBlock(model.bert.embeddings, "Embedding", ipu_id=0)
    per_ipu = -(-layers // ipus)
    for i, layer in enumerate(model.bert.encoder.layer):
        model.bert.encoder.layer[i] = poptorch.BeginBlock(layer, f"Encoder{i}", i // per_ipu)
    model.classifier = poptorch.BeginBlock(model.classifier, "Classifier", ipu_id=ipus - 1)
    return model


def gpt2(layers: int, hidden: int) -> nn.Module:
    """GPT2LMHeadModel: embeddings and the tied LM head on IPU 0, layers over IPUs 1-3."""
    config = transformers.GPT2Config(
        n_embd=hidden,
        n_layer=layers,
        n_head=hidden // 64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
    )
    model = transformers.GPT2LMHeadModel(config)
    t = model.transformer
    t.wte = poptorch.BeginBlock(t.wte, "Token embedding", ipu_id=0)
    per_ipu = -(-layers // 3)
    for i, layer in enumerate(t.h):
        t.h[i] = poptorch.BeginBlock(layer, f"Layer{i}", ipu_id=1 + i // per_ipu)
    model.lm_head = poptorch.BeginBlock(model.lm_head, "LM head", ipu_id=0)
    return model


def text(n: int, seq: int, vocab: int, labels: str) -> Batch:
    ids = torch.randint(0, vocab, (n, seq))
    batch = {"input_ids": ids, "attention_mask": torch.ones(n, seq, dtype=torch.long)}
    batch["labels"] = ids.clone() if labels == "tokens" else torch.randint(0, 2, (n,))
    return batch


def eager_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, ga: int) -> None:
    optimizer.zero_grad()
    micro = len(batch["input_ids"]) // ga
    for i in range(ga):
        mb = {k: v[i * micro : (i + 1) * micro] for k, v in batch.items()}
        (model(**mb).loss / ga).backward()
    optimizer.step()


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_times(name: str, model: nn.Module, batch: Batch, ga: int, stage: Any, steps: int):
    """Median seconds per step: pipelined on 4 IPUs and eager, interleaved."""
    eager = copy.deepcopy(model)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=1e-3)
    opts = poptorch.Options().setExecutionStrategy(poptorch.PipelinedExecution(stage))
    opts.Training.gradientAccumulation(ga)
    opts.showCompilationProgressBar(False)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-3))
    first = timed(lambda: training(**batch))
    stages = [s.ipu for s in training._executable.program.program.stages]
    pipe, plain, single = [], [], []
    threads = torch.get_num_threads()
    for _ in range(steps):
        pipe.append(timed(lambda: training(**batch)))
        torch.set_num_threads(os.cpu_count() or 1)
        plain.append(timed(lambda: eager_step(eager, eager_opt, batch, ga)))
        torch.set_num_threads(1)
        single.append(timed(lambda: eager_step(eager, eager_opt, batch, ga)))
        torch.set_num_threads(threads)
    training.destroy()
    p, e, e1 = (statistics.median(t) for t in (pipe, plain, single))
    print(
        f"{name}: stages on IPUs {stages}, GA {ga}, first call (compile + step) {first:.2f} s\n"
        f"  per step (median of {steps}): pipelined {p * 1e3:.0f} ms, eager {e * 1e3:.0f} ms "
        f"(eager on 1 thread {e1 * 1e3:.0f} ms); pipelined/eager {p / e:.2f}x, "
        f"pipelined/eager-1-thread {p / e1:.2f}x"
    )


def compile_times(layers: int, hidden: int, seq: int, repeats: int) -> None:
    """Compile (capture + split + workers) and capture alone of a BERT of this size."""
    batch = text(4 * 8, seq, 30522, "classes")
    compiles, captures = [], []
    for _ in range(repeats):
        model = bert(layers, hidden)
        opts = poptorch.Options()
        opts.Training.gradientAccumulation(8)
        opts.showCompilationProgressBar(False)
        training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters()))
        compiles.append(timed(lambda t=training: t.compile(**batch)))
        training.destroy()
        micro = {k: v[:4] for k, v in batch.items()}
        captures.append(timed(lambda m=model, b=micro: capture_model(m, (), b)))
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"BERT {layers} layers, hidden {hidden}, seq {seq} ({params:.0f} M parameters): "
        f"compile {statistics.median(compiles):.2f} s (median of {repeats}: "
        f"{', '.join(f'{c:.2f}' for c in compiles)}), of which torch.export capture "
        f"{statistics.median(captures):.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller models, fewer steps")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per model")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"{os.cpu_count()} CPU cores shared by 4 IPU worker threads; eager uses all of them")
    hidden, seq, steps = (128, 32, 2) if args.quick else (256, 128, args.steps)
    ga = 8
    auto = poptorch.AutoStage
    step_times(
        f"BERT 4 layers hidden {hidden} seq {seq}",
        bert(4, hidden),
        text(4 * ga, seq, 30522, "classes"),
        ga,
        auto.SameAsIpu,
        steps,
    )
    step_times(
        f"GPT-2 3 layers hidden {hidden} seq {seq}",
        gpt2(3, hidden),
        text(4 * 10, seq, 50257, "tokens"),
        10,
        auto.AutoIncrement,
        steps,
    )
    compile_times(2 if args.quick else 12, 128 if args.quick else 768, 128, 1 if args.quick else 3)


if __name__ == "__main__":
    main()
