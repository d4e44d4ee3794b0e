#!/usr/bin/env python3
"""Serve an IO-heavy image model from several threads, with and without IO tiles.

Run it with

    python serve_images.py                      # 1, 2, 3 and 4 client threads, both ways
    python serve_images.py --size 256 --profile-dir ./profile

The model takes large ``uint8`` images and returns a large float32 map per pixel, so copying
the inputs to the IPU and the outputs back costs about as much as the arithmetic. Both runs
reserve IO tiles (``Options.TensorLocations.numIOTiles``) and mark the input and the output
with ``poptorch.set_overlap_for_input/output``; only the mode differs. With
``OverlapMode.NoOverlap`` the compute tiles copy one request in, compute it and copy it out,
one after the other. With ``OverlapMode.OverlapDeviceIterationLoop`` the IO tiles copy while
the compute tiles work on another request: a three-stage pipeline (load, compute, store) that
only fills when at least three requests are in flight, which is why PopRT's guide asks for
three or more feeding threads.

The program prints requests per second for each number of client threads, checks every served
result against the model run eagerly, and with ``--profile-dir`` writes the execution trace
(open it in https://ui.perfetto.dev: tracks ``IPU 0 load``, ``IPU 0 compute``, ``IPU 0 store``)
and a utilisation plot beside it.
"""

from __future__ import annotations

import argparse
import math
import threading
import time

import torch
from torch import nn

import poptorch
from poptorch_sim.serving import Runner, RuntimeConfig

# The same seed every run, so two runs print the same numbers.
torch.manual_seed(0)

TILE_BYTES = 624 * 1024  # SRAM of one Mk2 IPU tile


class PixelClassifier(nn.Module):
    """uint8 RGB images → class scores for every pixel (float32, ``classes`` per pixel)."""

    def __init__(self, classes: int, mode: poptorch.OverlapMode) -> None:
        super().__init__()
        self.mode = mode
        self.features = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.scores = nn.Conv2d(8, classes, kernel_size=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # Mark the input where forward starts ...
        images = poptorch.set_overlap_for_input(images, self.mode)
        x = images.float() / 255 - 0.5
        scores = self.scores(torch.relu(self.features(x)))
        # ... and the output just before it is returned.
        return poptorch.set_overlap_for_output(scores, self.mode)


def io_tiles_for(args: argparse.Namespace) -> int:
    """The sizing rule: overlapped bytes / bytes per tile, up to a power of two, in [32, 192]."""
    pixels = args.batch * args.size * args.size
    overlapped = pixels * 3 + pixels * args.classes * 4  # uint8 in, float32 out
    tiles = 2 ** math.ceil(math.log2(max(1, math.ceil(overlapped / TILE_BYTES))))
    return max(32, min(192, tiles))


def make_model(
    args: argparse.Namespace, overlap: bool
) -> tuple[nn.Module, poptorch.PoplarExecutor]:
    overlap_mode = poptorch.OverlapMode.OverlapDeviceIterationLoop
    module = PixelClassifier(
        args.classes, overlap_mode if overlap else poptorch.OverlapMode.NoOverlap
    )
    opts = poptorch.Options()
    # Overlapped IO needs IO tiles, and is not supported with the default PipelinedExecution,
    # even on one IPU.
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts.TensorLocations.numIOTiles(io_tiles_for(args))
    if overlap and args.profile_dir:
        opts.enableProfiling(args.profile_dir)
    return module, poptorch.inferenceModel(module, opts)


def serve(runner: Runner, images: list[torch.Tensor], threads: int) -> tuple[float, list]:
    """Every image batch served once, by ``threads`` clients; (requests/s, outputs)."""
    outputs: list = [None] * len(images)

    def client(first: int) -> None:
        for i in range(first, len(images), threads):
            outputs[i] = runner.execute(images[i])

    pool = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return len(images) / (time.perf_counter() - start), outputs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=384, help="image height and width")
    parser.add_argument("--batch", type=int, default=2, help="images per request")
    parser.add_argument("--classes", type=int, default=8, help="scores per pixel")
    parser.add_argument("--requests", type=int, default=24, help="requests per measurement")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--profile-dir", default=None, help="write the trace and plot here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per simulated thread, so the threads do not fight
    images = [
        torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8)
        for _ in range(args.requests)
    ]
    print(f"numIOTiles by the sizing rule: {io_tiles_for(args)}")
    rates: dict[bool, dict[int, float]] = {}
    all_match = True
    for overlap in (False, True):
        module, model = make_model(args, overlap)
        # Each request is one model call: no waiting to batch requests together.
        with Runner(model, RuntimeConfig(timeout_ns=0, max_in_flight=3)) as runner:
            runner.execute(images[0])  # compiles
            rates[overlap] = {}
            for threads in args.threads:
                rate, outputs = serve(runner, images, threads)
                rates[overlap][threads] = rate
                with torch.no_grad():
                    all_match &= all(
                        torch.allclose(out, module(x), atol=1e-5)
                        for out, x in zip(outputs, images)
                    )
        model.destroy()  # writes the trace and the plot when profiling
    print(f"{'threads':>7} {'NoOverlap':>10} {'overlapped':>11} {'speed-up':>9}  (requests/s)")
    for threads in args.threads:
        without, with_io = rates[False][threads], rates[True][threads]
        print(f"{threads:>7} {without:>10.1f} {with_io:>11.1f} {with_io / without:>9.2f}")
    print(f"Served results equal the eager model: {all_match}")


if __name__ == "__main__":
    main()
