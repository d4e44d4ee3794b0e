#!/usr/bin/env python3
"""Does it fit? Memory per IPU for BERT-base and GPT-2, and what offload, RTS and recomputation
change.

Run it with

    python memory_planning.py                      # BERT-base and GPT-2 on 4 IPUs
    python memory_planning.py --plot-dir ./plots   # also draw each report

On an IPU the first question about a model is whether each IPU's share fits in its 900-odd MiB
of In-Processor Memory (a Mk2 IPU: 1472 tiles × 624 KiB). What an IPU holds is its stages'
weights, their gradient accumulators, the optimizer state, the activations stashed for every
micro-batch in flight in the pipeline, and the program's code.

Part 1 builds BERT-base and GPT-2 (124M) on the ``meta`` device, so nothing is allocated, and
asks ``poptorch_sim.memory.plan`` where the ``BeginBlock``s should go on 4 IPUs: stages balanced
by FLOPs, every IPU under its limit. It does that four times: as is, with the optimizer state
off chip (``useOnChipStorage(False)``), sharded over 4 replicas (``useReplicatedTensorSharding``)
and with pipeline recomputation (``autoRecomputation``), and prints what each changes.

Part 2 trains a tiny BERT for real with the placement the planner suggests, and compares the
estimate made at compile (``poptorch_sim.memory_report``) with what the simulator really held
during a step (``poptorch_sim.memory.measure``), then again with every encoder layer's output
marked with ``poptorch.recomputationCheckpoint`` (stashed beside each stage's inputs).

The same report is printed for any PopTorch program by ``python -m poptorch_sim.memory
script.py`` (it stops at the first compile), and is written to the profile folder when
``opts.enableProfiling(dir)`` is set. ``POPTORCH_SIM_IPU_MEMORY`` changes the limit and
``POPTORCH_SIM_OUT_OF_MEMORY=error`` makes a model that does not fit fail to compile, as it
would on an IPU.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import transformers

import poptorch
import poptorch_sim
from poptorch_sim.memory import format_bytes, measure, plan

torch.manual_seed(0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ipus", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--ga", type=int, default=16, help="gradient accumulation")
    parser.add_argument("--plot-dir", help="draw each report into this folder")
    return parser.parse_args(argv)


def variants(ga: int) -> dict[str, poptorch.Options]:
    """The same training run four ways."""

    def base(replicas: int = 1) -> poptorch.Options:
        opts = poptorch.Options().replicationFactor(replicas)
        opts.Training.gradientAccumulation(ga)
        return opts

    offload = base()
    offload.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False)
    )
    rts = base(replicas=4)
    rts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useReplicatedTensorSharding(True)
    )
    recompute = base()
    recompute._Popart.set("autoRecomputation", 3)  # RecomputationType.Pipeline
    return {"as is": base(), "offload": offload, "RTS x4": rts, "recompute": recompute}


def on_meta(build: Any) -> torch.nn.Module:
    with torch.device("meta"):
        return build()


def study(name: str, model: torch.nn.Module, inputs: dict, args: argparse.Namespace) -> None:
    """Plan the model four ways; print the placement and memory of each."""
    print(f"\n=== {name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, "
          f"micro-batch {args.micro_batch} x {args.seq} tokens, GA {args.ga}, "
          f"{args.ipus} IPUs, LAMB ===")  # fmt: skip
    for label, opts in variants(args.ga).items():
        start = time.perf_counter()
        suggestion = plan(model, inputs, opts, args.ipus, optimizer="lamb")
        took = time.perf_counter() - start
        ipus = suggestion.report.ipus
        worst = max(ipus, key=lambda m: m.total)
        print(f"\n--- {label}: {'fits' if suggestion.fits else 'does NOT fit'}; fullest IPU "
              f"{worst.ipu} at {format_bytes(worst.total)} of {format_bytes(worst.limit)} "
              f"(planned in {took:.2f} s)")  # fmt: skip
        print(suggestion)
        if args.plot_dir:
            os.makedirs(args.plot_dir, exist_ok=True)
            slug = f"{name}_{label}".replace(" ", "_").replace("-", "")
            suggestion.report.plot(os.path.join(args.plot_dir, f"{slug}.png"))


def bert_base(args: argparse.Namespace) -> None:
    config = transformers.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = on_meta(lambda: transformers.BertForSequenceClassification(config))
    ids = torch.zeros(args.micro_batch, args.seq, dtype=torch.long, device="meta")
    labels = torch.zeros(args.micro_batch, dtype=torch.long, device="meta")
    study("BERT-base", model, {"input_ids": ids, "labels": labels}, args)


def gpt2(args: argparse.Namespace) -> None:
    config = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     use_cache=False)  # fmt: skip
    # transformers' SDPA mask helpers look at the mask's values (``.item()``), which a meta
    # tensor does not have: eager attention with an explicit mask never does.
    config._attn_implementation = "eager"
    model = on_meta(lambda: transformers.GPT2LMHeadModel(config))
    ids = torch.zeros(args.micro_batch, args.seq, dtype=torch.long, device="meta")
    mask = torch.ones_like(ids)
    study("GPT-2", model, {"input_ids": ids, "attention_mask": mask, "labels": ids}, args)


def tiny_bert_measured(args: argparse.Namespace) -> None:
    """Train a tiny BERT with the planner's placement; estimate against measurement."""
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=3,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    marked = transformers.BertForSequenceClassification(config)
    marked.load_state_dict(model.state_dict())
    mb, ga = 2, 8
    batch = {"input_ids": torch.randint(0, 128, (mb * ga, 16)),
             "labels": torch.randint(0, 3, (mb * ga,))}  # fmt: skip
    opts = poptorch.Options().autoRoundNumIPUs(True)
    opts.Training.gradientAccumulation(ga)
    opts._Popart.set("autoRecomputation", 3)
    first = {k: v[:mb] for k, v in batch.items()}
    suggestion = plan(model, first, opts, 3, optimizer="adamw")
    print("\n=== a tiny BERT, trained with the suggested placement and recomputation ===")
    print(suggestion)
    training = poptorch.trainingModel(
        suggestion.apply(model), opts, poptorch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    measured = measure(training, **batch)
    report = poptorch_sim.memory_report(training)
    print(f"\nestimated at compile in {1e3 * report.seconds:.1f} ms; "
          f"compile took {training.compilationTime().total_seconds() * 1e3:.0f} ms")  # fmt: skip
    print("IPU  weights est/measured   optimizer state est/measured   activations est/measured")
    for est, got in zip(report.ipus, measured):
        print(f"{est.ipu:>3}  {est.weights:>9} / {got.weights:<9}  "
              f"{est.optimizer_state:>13} / {got.optimizer_state:<13}  "
              f"{est.activations:>12} / {got.activations}")  # fmt: skip
    training.destroy()

    # Graphcore's BERT marks each encoder layer's output: with recomputation those values are
    # stashed per micro-batch too, and backward recomputes from them instead of the stage input.
    for layer in marked.bert.encoder.layer:
        layer.register_forward_hook(
            lambda module, inputs, out: poptorch.recomputationCheckpoint(out)
        )
    training = poptorch.trainingModel(
        suggestion.apply(marked), opts, poptorch.optim.AdamW(marked.parameters(), lr=1e-3)
    )
    measured = measure(training, **batch)
    report = poptorch_sim.memory_report(training)
    print("with recomputationCheckpoint on every layer's output, activations est/measured: "
          + ", ".join(f"IPU {e.ipu} {e.activations} / {g.activations}"
                      for e, g in zip(report.ipus, measured)))  # fmt: skip
    training.destroy()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    bert_base(args)
    gpt2(args)
    tiny_bert_measured(args)


if __name__ == "__main__":
    main()
