"""Sequence packing: packing time per million sequences, and padded vs packed BERT throughput.

Part 1 packs a million sequence lengths with ``pack_lengths`` (SPFHP and LPFHP) and reports the
median wall time of three runs, the time of the histogram step alone (``pack_histogram``), and
the packing efficiency, for two length distributions:

* ``poprt``: PopRT's synthetic SQuAD lengths, N(128, 128) rounded and clipped to 1..256;
* ``wikipedia``: lengths drawn from the published Wikipedia pre-training histogram (max 512),
  only with ``--histogram FILE`` (512 counts, one per line; the project does not ship it).

Part 2 answers the same requests with one randomly initialised BERT for question answering in
the tutorial's three modes (tutorials/packing/packed_bert.py): padded to ``max_seq_len``, packed
offline (LPFHP, rows prepared up front) and packed online (``PackRunner`` fed by 4 threads), 16
rows per ``inferenceModel`` call. ``speed-up`` is samples/s over the padded run's, measured in the
same process; ``ideal`` is ``max_seq_len / mean length``, and the issue's target for the offline
pack is 0.8 × ideal. Outputs of the three modes are compared (mean |difference|).

Run: ``python benchmarks/packing.py [--quick] [--histogram FILE]`` (transformers needed for part 2).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "tutorials" / "packing"))  # the experiment's three modes

from poptorch_sim.packing import pack_histogram, pack_lengths, packing_efficiency  # noqa: E402

# Counts of lengths 1..512 from ``--histogram``; without it there are no ``wikipedia`` rows.
WIKIPEDIA_512: np.ndarray | None = None


def distributions() -> list[str]:
    """The length distributions this run measures."""
    return ["poprt"] if WIKIPEDIA_512 is None else ["poprt", "wikipedia"]


def lengths_of(distribution: str, n: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """``n`` lengths from a named distribution, and its max length."""
    rng = np.random.default_rng(seed)
    if distribution == "poprt":
        return np.clip(rng.normal(128, 128, n).round(), 1, 256).astype(np.int64), 256
    assert WIKIPEDIA_512 is not None
    weights = WIKIPEDIA_512.astype(np.float64)
    return rng.choice(np.arange(1, 513), size=n, p=weights / weights.sum()), 512


def packing_times(n: int, repeats: int) -> list[str]:
    """Markdown rows: time to pack ``n`` sequences, per distribution and algorithm."""
    rows = []
    for distribution in distributions():
        lengths, max_len = lengths_of(distribution, n)
        histogram = np.bincount(lengths, minlength=max_len + 1)[1:]
        for algorithm in ("spfhp", "lpfhp"):
            totals, hist_times = [], []
            packs: list[list[int]] = []
            for _ in range(repeats):
                del packs  # the previous result's million objects would slow collections
                gc.collect()
                start = time.perf_counter()
                packs = pack_lengths(lengths, max_len, 12, algorithm)
                totals.append(time.perf_counter() - start)
                start = time.perf_counter()
                pack_histogram(histogram, max_len, 12, algorithm)
                hist_times.append(time.perf_counter() - start)
            efficiency = packing_efficiency(packs, lengths, max_len)
            rows.append(
                f"| {distribution} (max {max_len}) | {algorithm} | {n:,} | "
                f"{statistics.median(totals) * 1e6 / n:.2f} s | "
                f"{statistics.median(hist_times) * 1e3:.1f} ms | {efficiency:.2%} | "
                f"{lengths.mean() / max_len:.2%} |"
            )
    return rows


def throughput(distribution: str, n: int, hidden: int, layers: int) -> list[str]:
    """Markdown rows: padded vs packed offline vs online on one BERT, same process."""
    import packed_bert  # the tutorial (needs transformers)

    lengths, max_len = lengths_of(distribution, n, seed=1)
    argv = [
        "--max-seq-len", str(max_len), "--hidden-size", str(hidden), "--layers", str(layers),
        "--heads", "2", "--max-sequences-per-pack", "8", "--batch-size", "16",
    ]  # fmt: skip
    args = packed_bert.parse_args(argv)
    requests = packed_bert.make_requests(lengths, 1000, seed=1)
    model = packed_bert.build_model(args)
    with torch.no_grad():
        results = {
            "padded": packed_bert.run_padded(model, requests, args),
            "packed offline": packed_bert.run_offline(model, requests, args),
            "packed online": packed_bert.run_online(model, requests, args),
        }
    base = n / results["padded"]["seconds"]
    ideal = max_len / lengths.mean()
    rows = []
    for name, result in results.items():
        rate = n / result["seconds"]
        difference = packed_bert.mean_abs_difference(
            results["padded"]["outputs"], result["outputs"]
        )
        rows.append(
            f"| {distribution} (max {max_len}, mean {lengths.mean():.0f}) | {name} | {rate:.1f} | "
            f"{rate / base:.2f}x | {ideal:.2f}x | {result['latency'] * 1e3:.1f} | {difference:.2g} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--intra-op-threads", type=int, default=1)
    parser.add_argument(
        "--histogram", type=Path, help="Wikipedia length histogram: 512 counts, one per line"
    )
    args = parser.parse_args()
    if args.histogram is not None:
        global WIKIPEDIA_512
        WIKIPEDIA_512 = np.loadtxt(args.histogram, dtype=np.int64)
    # One setting for every mode; see the tutorial's note on busy machines.
    torch.set_num_threads(args.intra_op_threads)
    n = 100_000 if args.quick else 1_000_000
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads\n")
    print("| lengths | algorithm | sequences | time per million | histogram step | efficiency "
          "| padded efficiency |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in packing_times(n, repeats=1 if args.quick else 3):
        print(row, flush=True)
    print()
    print(
        "| lengths | mode | samples/s | speed-up | ideal | latency ms | mean abs diff vs padded |"
    )
    print("|---|---|---|---|---|---|---|")
    counts = {"poprt": 160 if args.quick else 800, "wikipedia": 64 if args.quick else 320}
    for distribution in distributions():
        count = counts[distribution]
        for row in throughput(distribution, count, hidden=64 if args.quick else 128, layers=2):
            print(row, flush=True)
    print(
        "\nlatency: median time of one 16-row model call (padded, offline) or of one request "
        "from submission to result, all requests submitted at once (online)"
    )


if __name__ == "__main__":
    main()
