"""``python -m poptorch_sim.datasets [ROOT]``: put MNIST (real or stand-in) under ROOT."""

from __future__ import annotations

import argparse

from .mnist_standin import ensure_mnist


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m poptorch_sim.datasets [--offline] [ROOT]``."""
    parser = argparse.ArgumentParser(
        prog="python -m poptorch_sim.datasets",
        description="Make torchvision.datasets.MNIST(ROOT, download=True) work offline.",
    )
    parser.add_argument("root", nargs="?", default="~/.torch/datasets", help="dataset root")
    parser.add_argument("--offline", action="store_true", help="do not try to download")
    parser.add_argument("--seed", type=int, default=0, help="stand-in seed (default: 0)")
    args = parser.parse_args(argv)
    ensure_mnist(args.root, download=False if args.offline else None, seed=args.seed)


if __name__ == "__main__":
    main()
