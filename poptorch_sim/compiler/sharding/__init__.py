"""Manual sharding (PopRT's ``Sharder``): cut a captured graph at named nodes onto IPUs and stages.

    config.py     split points from ``Sharder(sharding_info, pipelining_info)`` or PopRT's YAML
    algorithm.py  PopRT's rule: each op's device and stage (see [Note: PopRT's sharding rule])
    partition.py  the compiler's ``Partition`` from that assignment
    nodes.py      ``list_nodes``: the names to choose split points from

A model gets its split points from, in this order: ``Sharder.run`` (kept on the model, so the
device copy that ``trainingModel`` makes carries them), ``Options.setManualShardingConfig``, or
``POPTORCH_SIM_SHARDING_CONFIG`` (what ``python -m poptorch_sim.shard --config`` sets). The
compiler then captures the model as usual and partitions it by the assignment instead of by
blocks; the runtime runs it pipelined or sharded like any other staged program.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ... import env
from ...logger import logger
from ...options.strategies import _IExecutionStrategy
from ..capture import capture_model
from ..partition import Partition
from ..tracer import Trace
from .algorithm import Assignment, Shard, assign, check_devices
from .config import ShardingConfig, ShardingError, SplitPoint, load_sharding_config
from .nodes import NodeInfo, list_nodes
from .partition import shard_partition

__all__ = [
    "Sharder",
    "list_nodes",
    "NodeInfo",
    "ShardingConfig",
    "ShardingError",
    "SplitPoint",
    "Shard",
    "Assignment",
    "assign",
    "load_sharding_config",
    "sharding_of",
    "partition_by_sharding",
    "MODEL_ATTR",
]

MODEL_ATTR = "_poptorch_sim_sharding"
OPTIONS_KEY = "manual_sharding"


class Sharder:
    """PopRT's manual sharding: split points by node name → a model cut exactly there.

    From each split point, in graph order, PopRT's rule walks towards the inputs and gives every
    op it reaches that split point's device and stage, stopping at ops already assigned; the
    ops left over go to (largest device + 1, largest stage + 1). See
    [Note: PopRT's sharding rule] in ``poptorch_sim/compiler/sharding/algorithm.py``.

    Args:
        sharding_info: split point node name → device (IPU).
        pipelining_info: split point node name → pipeline stage (same names). Default None:
            each split point's stage is its rank in graph order.
        capture_method: how to capture the graph whose node names are meant: "auto" (torch.fx,
            then torch.export for models fx cannot trace), "fx" or "export". Use the model's
            ``opts.Jit.captureMethod``: the two front ends name nodes differently.

    Raises:
        ShardingError: empty info, non-integer devices or stages, or the two dicts naming
            different nodes.

    >>> sharder = Sharder({"add": 0, "layer4_0_bn3": 1, "add_13": 2},
    ...                   {"add": 0, "layer4_0_bn3": 1, "add_13": 2})
    >>> # model = sharder.run(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224))
    >>> # poptorch.trainingModel(model, opts, optimizer)  # 4 stages on 4 IPUs
    """

    def __init__(
        self,
        sharding_info: Mapping[str, int],
        pipelining_info: Mapping[str, int] | None = None,
        *,
        capture_method: str = "auto",
    ) -> None:
        self.config = ShardingConfig.from_info(sharding_info, pipelining_info)
        self.capture_method = capture_method
        self._assignment: dict[str, tuple[int, int]] | None = None

    @classmethod
    def from_config(cls, config: ShardingConfig) -> Sharder:
        """A ``Sharder`` for an already built ``ShardingConfig`` (e.g. one read from YAML)."""
        sharder = cls.__new__(cls)
        sharder.config = config
        sharder.capture_method = "auto"
        sharder._assignment = None
        return sharder

    def run(self, model: nn.Module, *example_inputs: Any, **example_kwargs: Any) -> nn.Module:
        """Check the split points on ``model``'s captured graph and attach them to ``model``.

        Like ``poptorch.BeginBlock``, this annotates ``model`` in place and returns it, so its
        parameters (and any optimizer built on them) stay the same objects; ``trainingModel``
        and ``inferenceModel`` then split it exactly at the split points (with
        ``PipelinedExecution`` or ``ShardedExecution``). A later ``run`` replaces them.

        Args:
            model: the model.
            *example_inputs: one example call's positional arguments (not run: only captured).
            **example_kwargs: its keyword arguments.

        Returns:
            ``model``.

        Raises:
            ShardingError: an unknown node (with the closest names), a stage order that sends
                activations backwards, a stage on two devices, more devices than reserved IPUs,
                or block annotations on the model.
            poptorch_sim.compiler.TraceFailure: the model cannot be captured.
        """
        trace = capture_model(
            model, tuple(example_inputs), dict(example_kwargs), self.capture_method
        )
        assignment = assign(trace, self.config)
        check_devices(assignment, self.config)
        shard_partition(trace, assignment, self.config)  # rejects models with blocks
        self._assignment = assignment.by_name()
        setattr(model, MODEL_ATTR, self.config)
        logger.info(
            "poptorch_sim Sharder: %d ops on %d IPUs (%s)",
            len(assignment.shard_of),
            assignment.num_devices,
            _summary(assignment),
        )
        return model

    @property
    def assignment(self) -> dict[str, tuple[int, int]]:
        """After ``run``: every op's name → (device, stage), in graph order.

        Raises:
            ShardingError: ``run`` has not been called.
        """
        if self._assignment is None:
            raise ShardingError("Sharder.assignment is known after Sharder.run(model, ...)")
        return dict(self._assignment)

    def __repr__(self) -> str:
        return f"Sharder({list(self.config.points)})"


def _summary(assignment: Assignment) -> str:
    counts: dict[Shard, int] = {}
    for shard in assignment.shard_of.values():
        counts[shard] = counts.get(shard, 0) + 1
    return ", ".join(
        f"{s.split or 'leftovers'} → device {s.device} stage {s.stage}: {n} ops"
        for s, n in counts.items()
    )


def sharding_of(model: nn.Module, options: Any) -> ShardingConfig | None:
    """The split points that apply to ``model`` (see the module docstring for the order)."""
    config = getattr(model, MODEL_ATTR, None)
    if isinstance(config, ShardingConfig):
        return config
    exists = getattr(options, "exists", None)
    if exists is not None and exists(OPTIONS_KEY):
        entries, source = options(OPTIONS_KEY)
        return ShardingConfig.from_entries(entries, source)
    path = env.sharding_config()
    return None if path is None else load_sharding_config(path)


def partition_by_sharding(
    trace: Trace, config: ShardingConfig, strategy: _IExecutionStrategy, replicas: int
) -> tuple[Partition, Assignment]:
    """The compiler's partition of a manually sharded model.

    Raises:
        ShardingError: any of ``Sharder.run``'s errors, or a phased execution strategy.
    """
    if strategy.mode == "phased":
        raise ShardingError(
            f"{config.source}: manual sharding runs with poptorch.PipelinedExecution or "
            f"poptorch.ShardedExecution, not {type(strategy).__name__}"
        )
    assignment = assign(trace, config)
    check_devices(assignment, config, replicas)
    return shard_partition(trace, assignment, config), assignment
