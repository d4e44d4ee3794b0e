"""``python -m poptorch_sim.shard``: run a script with PopRT's manual sharding config applied.

    python -m poptorch_sim.shard --config shard.yaml train.py --epochs 1
    python -m poptorch_sim.shard --config shard.yaml --check     # only validate the YAML

The YAML (PopRT's ``--manual_sharding_config`` format) is read and checked first; the script
then runs as ``__main__`` with its own arguments, and every model it compiles
(``trainingModel``/``inferenceModel``) is cut at the config's split points, unless
``Sharder.run`` or ``Options.setManualShardingConfig`` gave that model its own. The config
travels in ``POPTORCH_SIM_SHARDING_CONFIG``, so processes the script starts inherit it.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..compiler.sharding import ShardingError, load_sharding_config
from .program import run_program

__all__ = ["main"]

_ENV = "POPTORCH_SIM_SHARDING_CONFIG"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m poptorch_sim.shard",
        description="Run a PopTorch script with PopRT's manual sharding config applied.",
    )
    parser.add_argument(
        "--config",
        required=True,
        help="PopRT manual sharding YAML: a list of {node, device, stage}",
    )
    parser.add_argument("--check", action="store_true", help="only validate the config, then exit")
    parser.add_argument("script", nargs="?", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Validate the config, then run the script with it applied.

    Args:
        argv: the command line without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status (0; a script's own ``SystemExit`` propagates).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        config = load_sharding_config(args.config)
    except ShardingError as exc:
        parser.exit(2, f"python -m poptorch_sim.shard: {exc}\n")
    points = ", ".join(repr(p) for p in config.points)
    print(f"poptorch_sim.shard: {len(config.points)} split points from {args.config}: {points}")
    if args.check:
        return 0
    if args.script is None:
        parser.error("a script to run is required (or --check)")
    os.environ[_ENV] = os.path.abspath(args.config)
    run_program(args.script, args.args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
