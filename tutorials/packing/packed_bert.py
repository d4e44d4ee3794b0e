#!/usr/bin/env python3
"""Padded vs offline-packed vs online-packed inference of a BERT question-answering model.

PopRT's packing experiment on poptorch_sim: synthetic request lengths drawn from N(128, 128),
clipped to 1..256, batches of 16 rows of 256 tokens. The same randomly initialised
``transformers`` BERT answers every request three ways:

* padded: each request padded to 256 tokens, 16 requests per call (the baseline);
* packed offline: all requests packed into rows up front (``packing.pack``), 16 rows per call;
* packed online: requests arrive one by one from several threads; a ``PackRunner`` packs
  whatever has arrived into 16 rows until they are full or the timeout passes.

It prints throughput, latency, and the mean absolute difference between the three modes'
outputs (packing must not change any answer). Run:

    python tutorials/packing/packed_bert.py
    python tutorials/packing/packed_bert.py --num-samples 64 --max-seq-len 32 --hidden-size 32
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import transformers
from torch import nn

import poptorch
from poptorch_sim.packing import (
    PackedBertForQuestionAnswering,
    PackRunner,
    PackRunnerConfig,
    pack,
    packing_efficiency,
    unpack,
)

Outputs = dict[int, tuple[torch.Tensor, torch.Tensor]]  # sample -> (start logits, end logits)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The experiment's settings (defaults: PopRT's packing example, with a smaller BERT)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--num-samples", type=int, default=1600, help="requests to answer")
    add("--max-seq-len", type=int, default=256, help="tokens per row (padded length)")
    add("--mean-len", type=float, default=128, help="mean (and spread) of request lengths")
    add("--batch-size", type=int, default=16, help="rows per model call")
    add("--max-sequences-per-pack", type=int, default=8, help="requests per packed row")
    add("--algorithm", default="lpfhp", choices=["spfhp", "lpfhp"], help="offline packing")
    add("--timeout-us", type=int, default=15000, help="PackRunner timeout (microseconds)")
    add("--producers", type=int, default=4, help="threads sending online requests")
    add("--hidden-size", type=int, default=128)
    add("--layers", type=int, default=2)
    add("--heads", type=int, default=2)
    add("--seed", type=int, default=0)
    add("--intra-op-threads", type=int, default=1, help="torch.set_num_threads for every mode")
    return parser.parse_args(argv)


def synthetic_lengths(n: int, mean: float, max_len: int, seed: int) -> np.ndarray:
    """Request lengths ~ N(mean, mean), rounded and clipped to 1..max_len (PopRT's example)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(mean, mean, n).round(), 1, max_len).astype(np.int64)


def make_requests(lengths: np.ndarray, vocab_size: int, seed: int) -> list[dict[str, Any]]:
    """Random token ids, a question half and a context half (token types 0 then 1)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(1, vocab_size, (int(n),), generator=generator),
            "token_type_ids": (torch.arange(int(n)) >= int(n) // 2).long(),
        }
        for n in lengths
    ]


def build_model(args: argparse.Namespace) -> transformers.BertForQuestionAnswering:
    """A randomly initialised BERT for question answering (nothing is downloaded)."""
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=args.max_seq_len,
    )
    torch.manual_seed(args.seed)
    return transformers.BertForQuestionAnswering(config).eval()


class PaddedQA(nn.Module):
    """The unpacked model on padded rows, returning ``(start_logits, end_logits)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        return out.start_logits, out.end_logits


def _timed_calls(batches: list[Any], call: Callable[[Any], None]) -> tuple[float, list[float]]:
    """Total seconds and per-call seconds of ``call`` over ``batches`` (after one warm-up)."""
    call(batches[0])
    per_call = []
    start = time.perf_counter()
    for batch in batches:
        begin = time.perf_counter()
        call(batch)
        per_call.append(time.perf_counter() - begin)
    return time.perf_counter() - start, per_call


def run_padded(model: nn.Module, requests: list[dict], args: argparse.Namespace) -> dict:
    """Every request padded to ``max_seq_len``, ``batch_size`` requests per call."""
    length, rows = args.max_seq_len, args.batch_size
    inference = poptorch.inferenceModel(PaddedQA(model))
    batches = []
    for first in range(0, len(requests), rows):
        chunk = requests[first : first + rows]
        tensors = torch.zeros(3, rows, length, dtype=torch.long)  # ids, mask, token types
        for row, request in enumerate(chunk):
            n = len(request["input_ids"])
            tensors[0, row, :n] = request["input_ids"]
            tensors[1, row, :n] = 1
            tensors[2, row, :n] = request["token_type_ids"]
        batches.append((first, len(chunk), tensors))
    outputs: Outputs = {}

    def call(batch: tuple[int, int, torch.Tensor]) -> None:
        first, count, tensors = batch
        start, end = inference(*tensors)
        for row in range(count):
            n = len(requests[first + row]["input_ids"])
            outputs[first + row] = (start[row, :n], end[row, :n])

    seconds, per_call = _timed_calls(batches, call)
    inference.destroy()
    return {"outputs": outputs, "seconds": seconds, "latency": statistics.median(per_call)}


def run_offline(model: nn.Module, requests: list[dict], args: argparse.Namespace) -> dict:
    """All requests packed up front, ``batch_size`` packed rows per call."""
    slots, rows = args.max_sequences_per_pack, args.batch_size
    begin = time.perf_counter()
    packed = pack(
        requests, args.max_seq_len, slots, algorithm=args.algorithm, rows_multiple_of=rows
    )
    packing_seconds = time.perf_counter() - begin
    rows_of_ids = [[i for i in row if i >= 0] for row in packed.info.sample_index.tolist()]
    lengths = [len(r["input_ids"]) for r in requests]
    efficiency = packing_efficiency(rows_of_ids, lengths, args.max_seq_len)
    inference = poptorch.inferenceModel(PackedBertForQuestionAnswering(model, slots))
    names = ("input_ids", "attention_mask", "position_ids", "token_type_ids")
    total_rows = packed.inputs["input_ids"].shape[0]
    batches = list(range(0, total_rows, rows))
    starts = torch.empty(total_rows, args.max_seq_len)
    ends = torch.empty_like(starts)

    def call(first: int) -> None:
        start, end = inference(*(packed.inputs[k][first : first + rows] for k in names))
        starts[first : first + rows], ends[first : first + rows] = start, end

    seconds, per_call = _timed_calls(batches, call)
    inference.destroy()
    return {
        "outputs": unpack((starts, ends), packed.info),
        "seconds": seconds,
        "latency": statistics.median(per_call),
        "rows": total_rows,
        "efficiency": efficiency,
        "packing_seconds": packing_seconds,
    }


def run_online(model: nn.Module, requests: list[dict], args: argparse.Namespace) -> dict:
    """Requests sent one by one from ``producers`` threads through a ``PackRunner``."""
    slots = args.max_sequences_per_pack
    inference = poptorch.inferenceModel(PackedBertForQuestionAnswering(model, slots))
    config = PackRunnerConfig(
        max_seq_len=args.max_seq_len,
        batch_size=args.batch_size,
        max_sequences_per_pack=slots,
        timeout_microseconds=args.timeout_us,
    )
    outputs: Outputs = {}
    latencies: list[float] = []
    with PackRunner(inference, config) as runner:
        runner.execute(requests[0])  # warm-up, as the other modes get

        def produce(first: int) -> None:
            pending = []
            for i in range(first, len(requests), args.producers):
                pending.append((i, time.perf_counter(), runner.execute_async(requests[i])))
            for i, sent, future in pending:
                outputs[i] = future.result()
                latencies.append(time.perf_counter() - sent)

        begin = time.perf_counter()
        threads = [threading.Thread(target=produce, args=(p,)) for p in range(args.producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - begin
        stats = runner.stats
    inference.destroy()
    return {
        "outputs": outputs,
        "seconds": seconds,
        "latency": statistics.median(latencies),
        "batches": stats.batches - 1,
        "fill": stats.fill,
    }


def mean_abs_difference(a: Outputs, b: Outputs) -> float:
    """Mean |a - b| over every sample's start and end logits."""
    diffs = [torch.cat([(x - y).abs().flatten() for x, y in zip(a[i], b[i])]) for i in sorted(a)]
    return float(torch.cat(diffs).mean())


def main(argv: list[str] | None = None) -> dict[str, dict]:
    """Run the three modes and print the comparison."""
    args = parse_args(argv)
    # The same for all three modes. On a machine whose cores are busy, OpenMP teams of several
    # threads wait on each other and one thread can be several times faster.
    torch.set_num_threads(args.intra_op_threads)
    lengths = synthetic_lengths(args.num_samples, args.mean_len, args.max_seq_len, args.seed)
    requests = make_requests(lengths, 1000, args.seed)
    model = build_model(args)
    print(
        f"{args.num_samples} requests, mean length {lengths.mean():.1f} of {args.max_seq_len} "
        f"(padding would be {1 - lengths.mean() / args.max_seq_len:.1%} of the tokens); "
        f"ideal packed speed-up {args.max_seq_len / lengths.mean():.2f}x"
    )
    with torch.no_grad():
        results = {
            "padded": run_padded(model, requests, args),
            "packed offline": run_offline(model, requests, args),
            "packed online": run_online(model, requests, args),
        }
    offline = results["packed offline"]
    print(
        f"offline: {args.algorithm} packed them into {offline['rows']} rows ({offline['efficiency']:.1%}"
        f" of the slots hold tokens) in {offline['packing_seconds'] * 1e3:.1f} ms; "
        f"online: {results['packed online']['batches']} calls, "
        f"{results['packed online']['fill']:.1%} of their slots hold tokens"
    )
    base = args.num_samples / results["padded"]["seconds"]
    print(f"{'mode':<16}{'samples/s':>12}{'speed-up':>10}{'latency ms':>12}")
    for name, result in results.items():
        rate = args.num_samples / result["seconds"]
        print(f"{name:<16}{rate:>12.1f}{rate / base:>9.2f}x{result['latency'] * 1e3:>12.2f}")
    print(
        "latency: median time of one model call (padded, offline), or of one request from "
        "submission to result (online; all requests are submitted at once, so it includes "
        "their wait in the queue)"
    )
    pairs = [("padded", "packed offline"), ("padded", "packed online")]
    pairs.append(("packed offline", "packed online"))
    for a, b in pairs:
        difference = mean_abs_difference(results[a]["outputs"], results[b]["outputs"])
        print(f"mean |difference| of outputs, {a} vs {b}: {difference:.3g}")
    return results


if __name__ == "__main__":
    main()
