"""Joined outputs: fresh memory, a reused buffer, computed in place; one model, calls alternating.

A language-model head (hidden 256 → 32,000 logits, 10 micro-batches of 4 × 128 tokens: a
655 MB output per call), sharded over two IPUs, inference. Each round runs one call whose output
is joined after the run into fresh memory (the executable's kept buffers off), one joined after
the run into a reused buffer (see [Note: output buffers are reused] in
``poptorch_sim/executor/host_buffers.py``), one computed in place in a reused buffer (the
default, see [Note: outputs computed in place] in ``poptorch_sim/runtime/in_place.py``) and the
same micro-batches in eager PyTorch under ``torch.no_grad()``; medians.

Run: ``python benchmarks/output_buffers.py [--quick] [--rounds N] [--vocab V]`` (``--quick``: a
1,024-wide head, 21 MB out, still over the kept buffers' 8 MiB floor; one round)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import poptorch_sim as poptorch  # noqa: E402


class Head(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = poptorch.BeginBlock(nn.Embedding(vocab, hidden), "Embedding", ipu_id=0)
        self.body = poptorch.BeginBlock(nn.Linear(hidden, hidden), "Body", ipu_id=1)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.embed(ids))))


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,024-wide head, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    if args.quick:
        args.vocab, args.rounds = 1024, 1
    torch.manual_seed(0)
    model = Head(args.vocab, args.hidden).eval()
    di, micro, seq = 10, 4, 128
    ids = torch.randint(0, args.vocab, (di * micro, seq))
    opts = poptorch.Options().deviceIterations(di)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    sim = poptorch.inferenceModel(model, opts)
    out = sim(ids)
    with torch.no_grad():
        torch.testing.assert_close(out, model(ids), rtol=0, atol=0)
    del out
    buffers = sim._executable.host_outputs  # the executable's kept output buffers

    def eager() -> None:
        with torch.no_grad():
            for part in ids.split(micro):
                model(part)

    executors = sim._executable.program.runtime.stage_executors().values()
    in_place = {e: e.in_place for e in executors}  # See [Note: outputs computed in place]

    def computing_in_place(on: bool) -> None:
        for executor, module in in_place.items():
            executor.in_place = module if on else None

    fresh, joined, reused, plain = [], [], [], []
    for _ in range(args.rounds):
        buffers.clear()
        buffers._keep = 0
        computing_in_place(False)
        fresh.append(timed(lambda: sim(ids)))
        buffers._keep = 2
        sim(ids)  # leaves a buffer to reuse
        joined.append(timed(lambda: sim(ids)))
        computing_in_place(True)
        reused.append(timed(lambda: sim(ids)))
        plain.append(timed(eager))
    sim.destroy()
    f, j, r, e = (statistics.median(x) * 1e3 for x in (fresh, joined, reused, plain))
    mb = di * micro * seq * args.vocab * 4 / 1e6
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, output {mb:,.0f} MB")
    print("| output | sim ms | eager ms | eager / sim |")
    print("|---|---|---|---|")
    print(f"| joined after the run into fresh memory | {f:,.0f} | {e:,.0f} | {e / f:.2f}x |")
    print(f"| joined after the run into a reused buffer | {j:,.0f} | {e:,.0f} | {e / j:.2f}x |")
    print(f"| computed in place in a reused buffer | {r:,.0f} | {e:,.0f} | {e / r:.2f}x |")


if __name__ == "__main__":
    main()
