"""Overlapped IO: serving throughput with IO tiles vs the same copies just in time, 1-4 threads.

The model is IO-heavy: each request is ``batch`` uint8 images of ``3 × size × size`` (loaded
into a device buffer); it computes their per-channel normalisation in float32 and returns it,
four times the input's bytes (stored back into host memory).

Three ways to serve it, each through ``poptorch_sim.serving.Runner`` (``timeout_ns=0``, one
request per model call, up to 3 calls in flight) fed by 1, 2, 3 and 4 client threads:

* overlapped: ``numIOTiles(64)`` + ``set_overlap_for_input/output``: load, compute and store
  of different requests run on three threads at once (``runtime/io_tiles.py``).
* just-in-time: the same IO tiles, inputs and outputs marked ``OverlapMode.NoOverlap``: the
  same copies, done by one thread one phase after the other, as PopTorch's NoOverlap (compute
  tiles, JustInTime) does.
* plain: no IO tiles at all; the simulator's host memory is its device memory, so it skips the
  copies: an upper bound no IPU has, shown for context.

From one traced just-in-time request stream (1 thread) come the phase medians ``L``, ``C`` and
``S``; the serial time is ``L + C + S`` and the pipeline's ideal is ``max(L, C, S)`` per
request. Efficiency is measured throughput / (1 / max(L, C, S)). ``ceiling`` is how much
faster three threads get through independent copies than one right now: the most any 3-stage
pipeline can gain on this machine at this moment (about 2 on an idle two-core machine).

Run: ``.venv/bin/python benchmarks/overlap_io.py [--quick]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import poptorch_sim as poptorch
from poptorch_sim.serving import Runner, RuntimeConfig

MODES = {
    "overlapped": poptorch.OverlapMode.OverlapDeviceIterationLoop,
    "just-in-time": poptorch.OverlapMode.NoOverlap,
    "plain": None,
}


class Normalise(nn.Module):
    """uint8 images → float32 images normalised per channel."""

    def __init__(self, mode: poptorch.OverlapMode | None) -> None:
        super().__init__()
        self.mode = mode
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.mode is not None:
            images = poptorch.set_overlap_for_input(images, self.mode)
        y = (images.float() / 255 - self.mean) / self.std
        return y if self.mode is None else poptorch.set_overlap_for_output(y, self.mode)


class Waiting(nn.Module):
    """Compute that waits ``wait_s`` (a kernel on an accelerator) and returns a float32 map of
    the images' shape; load and store are still real copies on the host's cores."""

    def __init__(
        self, mode: poptorch.OverlapMode | None, wait_s: float, shape: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.mode, self.wait_s = mode, wait_s
        self.register_buffer("result", torch.rand(shape))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.mode is not None:
            images = poptorch.set_overlap_for_input(images, self.mode)
        time.sleep(self.wait_s)
        y = self.result
        return y if self.mode is None else poptorch.set_overlap_for_output(y, self.mode)


def build(
    kind: str, args: argparse.Namespace, wait_s: float | None, profile_dir: str | None = None
) -> poptorch.PoplarExecutor:
    """A compiled inference model served the ``kind`` way (computing, or waiting ``wait_s``),
    writing its execution trace to ``profile_dir`` when given."""
    mode = MODES[kind]
    if wait_s is None:
        module: nn.Module = Normalise(mode)
    else:
        module = Waiting(mode, wait_s, tuple(images(args).shape))
    opts = poptorch.Options()
    if mode is not None:
        opts.setExecutionStrategy(poptorch.ShardedExecution())
        opts.TensorLocations.numIOTiles(64)
    if profile_dir is not None:
        opts.enableProfiling(profile_dir)
    model = poptorch.inferenceModel(module, opts)
    model.compile(images(args))
    return model


def images(args: argparse.Namespace) -> torch.Tensor:
    return torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8)


def serve(model: poptorch.PoplarExecutor, threads: int, requests: int, x: torch.Tensor) -> float:
    """Requests per second with ``threads`` clients each calling ``execute`` in a loop."""
    per_thread = requests // threads
    with Runner(model, RuntimeConfig(timeout_ns=0, max_in_flight=3)) as runner:
        runner.execute(x)  # warm-up

        def client() -> None:
            for _ in range(per_thread):
                runner.execute(x)

        pool = [threading.Thread(target=client) for _ in range(threads)]
        start = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - start
    return per_thread * threads / elapsed


def phases(
    args: argparse.Namespace, wait_s: float | None, x: torch.Tensor, requests: int
) -> dict[str, float]:
    """Median ms of each phase over ``requests`` one-at-a-time requests (no overlap), read from
    the Chrome trace that a just-in-time model with profiling enabled writes when destroyed."""
    with tempfile.TemporaryDirectory() as folder:
        model = build("just-in-time", args, wait_s, folder)
        for _ in range(requests):
            model(x)
        model.destroy()
        traces = [json.loads(path.read_text()) for path in Path(folder).glob("*.json")]
    # The folder also holds the memory report (JSON without trace events).
    events = [e for trace in traces for e in trace.get("traceEvents", [])]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans: dict[str, list[float]] = {"load": [], "compute": [], "store": []}
    for e in events:
        if e.get("ph") == "X":
            phase = tracks[e["tid"]].rsplit(" ", 1)[-1]
            if phase in spans:
                spans[phase].append(e["dur"] / 1e3)
    missing = [phase for phase, times in spans.items() if not times]
    if missing:
        raise RuntimeError(f"the profiled model's trace has no {', '.join(missing)} spans")
    return {phase: statistics.median(times) for phase, times in spans.items()}


def ceiling(x: torch.Tensor) -> float:
    """How much faster 3 threads finish 3 × 20 copies than one thread finishes them."""
    y = torch.empty(x.shape, dtype=torch.float32)

    def work(count: int) -> None:
        torch.get_num_threads()
        torch.set_num_threads(1)
        for _ in range(count):
            y.clone().copy_(x)

    start = time.perf_counter()
    work(60)
    alone = time.perf_counter() - start
    pool = [threading.Thread(target=work, args=(20,)) for _ in range(3)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return alone / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="images per request")
    parser.add_argument("--size", type=int, default=512, help="image height and width")
    parser.add_argument("--requests", type=int, default=48, help="requests per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell (median)")
    parser.add_argument("--wait-ms", type=float, default=10.0, help="second table's compute")
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    args = parser.parse_args()
    if args.quick:
        args.size, args.requests, args.repeats, args.wait_ms = 128, 12, 1, 2.0
    torch.set_num_threads(1)  # one intra-op thread per simulated IPU thread (see intra_op.py)
    print(
        f"request: {args.batch}x3x{args.size}x{args.size} uint8 in, "
        f"{args.batch}x3x{args.size}x{args.size} float32 out; "
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread"
    )
    print("\n== compute: per-channel normalisation on the host's cores")
    table(args, None)
    print(f"\n== compute: waits {args.wait_ms:g} ms (an accelerator kernel); copies on the cores")
    table(args, args.wait_ms / 1e3)


def table(args: argparse.Namespace, wait_s: float | None) -> None:
    """Phase medians, then throughput per client-thread count for the three ways."""
    x = images(args)
    models = {kind: build(kind, args, wait_s) for kind in ("overlapped", "just-in-time", "plain")}
    times = phases(args, wait_s, x, max(6, args.requests // 4))
    serial, bound = sum(times.values()), max(times.values())
    print(
        "phases (ms, median, no overlap): "
        + ", ".join(f"{k} {v:.2f}" for k, v in times.items())
        + f"; serial {serial:.2f}, ideal pipelined {bound:.2f} (x{serial / bound:.2f})"
    )
    print(
        f"{'threads':>7} {'overlapped':>11} {'just-in-time':>13} {'plain':>8} "
        f"{'ovl/jit':>8} {'efficiency':>10} {'ceiling':>8}   (requests/s, medians)"
    )
    for threads in (1, 2, 3, 4):
        rates = {kind: [] for kind in models}
        for _ in range(args.repeats):
            for kind, model in models.items():  # interleaved, so load spikes hit all three
                rates[kind].append(serve(model, threads, args.requests, x))
        med = {kind: statistics.median(r) for kind, r in rates.items()}
        efficiency = med["overlapped"] * bound / 1e3
        print(
            f"{threads:>7} {med['overlapped']:>11.1f} {med['just-in-time']:>13.1f} "
            f"{med['plain']:>8.1f} {med['overlapped'] / med['just-in-time']:>8.2f} "
            f"{efficiency:>10.2f} {ceiling(x):>8.2f}"
        )
    for model in models.values():
        model.destroy()


if __name__ == "__main__":
    main()
