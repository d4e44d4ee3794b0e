"""The compiler: ``nn.Module + Options`` → ``StagedProgram`` (trace → partition → verify → split).

    capture    capture.py    forward → Trace, by torch.fx (tracer.py) or torch.export
                             (exporter.py), ops stamped with block entries
    partition  partition.py  ops → stages and IPUs by the execution strategy
    verify     verify.py     PopTorch's compile-time checks (pipeline depth, IPU count, phases)
    loss       loss.py       the final loss (training)
    split      split.py      one GraphModule per stage, sharing the model's parameters
    sharding   sharding/     PopRT's manual sharding: ops → stages and IPUs by named split points
                             (replaces partition when a model has split points)

Models without any block annotation or split points do not need the compiler (``uses_blocks``
is False): the executor runs them eagerly on one IPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from ..logger import logger
from ..ops.blocks import uses_begin_block
from ..options.strategies import PipelinedExecution, _IExecutionStrategy
from ..program import StagedProgram
from .capture import capture_method, capture_model
from .loss import MANY_LOSSES, NO_LOSS, find_final_loss
from .partition import NO_ACTIVE_BLOCK, Partition
from .partition import partition as assign_stages
from .sharding import ShardingConfig, ShardingError, partition_by_sharding, sharding_of
from .signature import flatten_inputs
from .split import output_layout
from .split import split as split_stages
from .tracer import Trace, TraceFailure, entries_seen
from .values import non_tensor_values
from .verify import check_ipu_count, check_phases, check_pipeline_depth, pipeline_stages

__all__ = [
    "compile_program",
    "capture_model",
    "Trace",
    "uses_blocks",
    "flatten_inputs",
    "rebuild_output",
    "describe",
    "TraceFailure",
    "NO_ACTIVE_BLOCK",
    "NO_LOSS",
    "MANY_LOSSES",
]


def _strategy(options: Any) -> _IExecutionStrategy:
    strategy = getattr(options, "_execution_strategy", None)
    return strategy if strategy is not None else PipelinedExecution()


def uses_blocks(
    model: nn.Module,
    options: Any = None,
    example_inputs: tuple[Any, ...] = (),
    example_kwargs: dict[str, Any] | None = None,
) -> bool:
    """Whether ``model`` has block annotations or split points (then it needs ``compile_program``).

    ``BeginBlock`` annotations are found on the modules; ``with Block`` inside ``forward`` is
    found by tracing ``forward`` once (cheap: nothing is computed). A model that cannot be
    traced before any block is entered counts as having none.

    Raises:
        TraceFailure: tracing failed after a block was entered.
    """
    if uses_begin_block(model) or sharding_of(model, options) is not None:
        return True
    return entries_seen(model, tuple(example_inputs), dict(example_kwargs or {}))


def compile_program(
    model: nn.Module,
    options: Any,
    example_inputs: tuple[Any, ...],
    example_kwargs: dict[str, Any],
    training: bool,
) -> StagedProgram:
    """Cut ``model`` into stages on IPUs following ``options``' execution strategy.

    Args:
        model: the (device copy of the) model; the stages share its parameters and buffers.
        options: its ``poptorch.Options`` (strategy, deviceIterations, gradientAccumulation,
            replicationFactor, autoRoundNumIPUs).
        example_inputs: one micro-batch of positional arguments.
        example_kwargs: keyword arguments.
        training: whether the program trains (a final loss is required).

    Returns:
        The ``StagedProgram`` (see ``describe`` for its ``meta``).

    Raises:
        TraceFailure: ``forward`` cannot be captured (see ``capture_model``).
        poptorch.Error: PopTorch's compile errors (no active block, loss, depth, IPU count).
        AssertionError: unknown blocks / ``SameAsIpu`` without ``ipu_id`` (PopTorch's type).
        ShardingError: split points that cannot be applied (see ``sharding.Sharder.run``).
    """
    strategy = _strategy(options)
    sharding = sharding_of(model, options)
    trace = _capture(
        model, tuple(example_inputs), dict(example_kwargs), capture_method(options), sharding
    )
    assignment = None
    if sharding is None:
        part = assign_stages(trace, strategy)
        check_phases(strategy, part.placements)
    else:
        part, assignment = partition_by_sharding(
            trace, sharding, strategy, options.replication_factor
        )
    num_ipus = check_ipu_count({stage.ipu for stage in part.stages}, options)
    if strategy.mode == "pipelined":
        check_pipeline_depth(part.forward_stages, options, training)
    loss = find_final_loss(trace) if training else None
    layout = output_layout(trace)
    required = layout.nodes + ([loss] if loss is not None else [])
    traced = trace.graph_module()
    stages = split_stages(part, trace, required)
    program = StagedProgram(
        stages=stages,
        input_names=trace.input_names,
        output_names=tuple(node.name for node in layout.nodes),
        loss_name=None if loss is None else loss.name,
        sharded=strategy.mode != "pipelined",
        meta=_meta(trace, part, strategy, training, num_ipus, traced),
    )
    program.meta.update(out_spec=layout.spec, out_constants=layout.constants)
    if loss is not None:
        program.meta["loss_stage"] = part.stage_of.get(loss)
    if sharding is not None and assignment is not None:
        program.meta.update(sharding=assignment.by_name(), sharding_source=sharding.source)
    logger.debug("poptorch_sim compiled program:\n%s", describe(program))
    return program


def _capture(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    method: str,
    sharding: ShardingConfig | None,
) -> Trace:
    """The model's trace; a model that must be sharded by node name has no eager fallback."""
    try:
        return capture_model(model, args, kwargs, method)
    except TraceFailure as failure:
        if sharding is None:
            raise
        raise ShardingError(
            f"{sharding.source}: manual sharding needs the model's graph, which could not be "
            f"captured: {failure}"
        ) from failure


def _meta(
    trace: Trace,
    part: Partition,
    strategy: _IExecutionStrategy,
    training: bool,
    num_ipus: int,
    traced: fx.GraphModule,
) -> dict[str, Any]:
    entries = [
        {"block": e.block_id, "stage": s, "ipu": p.ipu, "phase": p.phase, "location": e.location}
        for e, p, s in zip(trace.entries, part.placements, part.entry_stage)
    ]
    block_map: dict[str, dict[str, Any]] = {}
    for entry in entries:
        block_map.setdefault(entry["block"], {"stage": entry["stage"], "ipu": entry["ipu"]})
    return {
        "mode": strategy.mode,
        "strategy": repr(strategy),
        "block_map": block_map,
        "entries": entries,
        "forward_stages": part.forward_stages,
        "pipeline_stages": pipeline_stages(part.forward_stages, training),
        "num_ipus": num_ipus,
        "signature": trace.signature,
        "non_tensor_values": non_tensor_values(trace.graph),
        "traced": traced,
        "capture": trace.capture,
    }


def rebuild_output(program: StagedProgram, values: Sequence[Any]) -> Any:
    """``forward``'s return structure from the values of ``program.output_names``, in order.

    >>> # out = rebuild_output(program, [results[name] for name in program.output_names])
    """
    constants = program.meta["out_constants"]
    spec = program.meta["out_spec"]
    produced = iter(values)
    leaves = [constants[i] if i in constants else next(produced) for i in range(spec.num_leaves)]
    return pytree.tree_unflatten(leaves, spec)


def describe(program: StagedProgram) -> str:
    """A readable map of the program: one line per stage (IPU, blocks, values in and out).

    ``program.meta`` holds: ``mode`` ("pipelined", "sharded", "phased"), ``strategy`` (repr),
    ``block_map`` (block → {"stage", "ipu"} of its first entry), ``entries`` (each block entry:
    block, stage, ipu, phase, source location), ``forward_stages`` / ``pipeline_stages``
    (PopTorch's depths), ``num_ipus`` (IPUs reserved, replicas included), ``signature``
    (forward's, for ``flatten_inputs``), ``non_tensor_values`` (names of values that are not
    tensors, e.g. sizes: pass them between stages as they are), ``traced``
    (the whole traced GraphModule), ``capture`` (the front end that captured forward:
    "torch.fx" or "torch.export"), ``out_spec`` / ``out_constants`` (see ``rebuild_output``)
    and, when training, ``loss_stage``.
    """
    lines = [
        f"{program.meta.get('mode', '?')} program on {program.meta.get('num_ipus', '?')} IPU(s), "
        f"inputs {list(program.input_names)} -> outputs {list(program.output_names)}"
        + (f", loss {program.loss_name}" if program.loss_name else "")
    ]
    lines += [f"  {stage!r}" for stage in program.stages]
    return "\n".join(lines)
