"""PopTorch's op library, ``torch.ops.poptorch.*``, with PopTorch's schemas.

[Note: the torch.ops.poptorch library]
PopTorch registers its ops with the dispatcher (``TORCH_LIBRARY(poptorch, m)``); its Python API
calls them, and so do applications (Graphcore's CNNs push and pop name scopes from module hooks,
``torch.ops.poptorch.push_name_scope(name)``). Here every op is defined with PopTorch's schema
and one ``CompositeImplicitAutograd`` kernel that does what the op means on an IPU:

    op                                       kernel
    begin_ipu_block / end_ipu_block          a block entry / exit, as ``poptorch.Block`` reports
    push/pop_name_scope, set/clear_attribute the ``NameScope`` / ``Attribute`` scopes
    nop, recomputation_checkpoint, set_*     the input, unchanged (identity)
    optimizer_group, *_multi_conv, *_loop    nothing (markers for PopART), or the CPU meaning
    ipu_print_tensor, dynamic_*, ctc, fps    ``poptorch_sim.ops``'s implementations
    identity_loss, internal_cast             PopTorch's reduction codes / cast names

Composite kernels keep autograd free (gradients flow through what the kernel does) and keep the
op visible to both captures: torch.fx records ``torch.ops.poptorch.x(proxy)`` as one node whose
kernel runs when the stage runs, and ``torch.export`` keeps custom composite ops as nodes too,
running the kernel once on fake tensors to learn the output's shape. A kernel given fake tensors
therefore returns a result of the right shape without printing or reading values
(``_symbolic``). Markers without tensors (block entries, name scopes) run while ``forward`` is
captured, which is when the block recorder listens; replayed later, they find no recorder and
do nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch._subclasses.fake_tensor import is_fake

from ..errors import createPoptorchError
from . import blocks, loss, misc, printing, slicing
from .annotations import Attribute, NameScope, name_scope_depth
from .custom import _lookup

__all__ = ["CAPTURE_ONLY", "LIBRARY", "SCHEMAS", "FLOAT_FORMATS", "REDUCTIONS"]

# PopTorch's schemas (its dispatch_tracer/RegisterAtenOverloads.cpp), one per op.
SCHEMAS: dict[str, str] = {
    "begin_ipu_block": "(int stage_id, int phase_id, int ipu_id) -> ()",
    "end_ipu_block": "() -> ()",
    "start_for_loop": "(Tensor[] inputs) -> ()",
    "start_if_block": "(Tensor condition) -> ()",
    "start_else_block": "(Tensor[] outputs_true) -> ()",
    "optimizer_group": "(int group, Tensor[] inputs) -> ()",
    "begin_multi_conv": "() -> ()",
    "end_multi_conv": "(float[]? available_memory_proportions, int[]? partials_types, "
    "int? plan_type, int? per_conv_reserved_tiles, float? cycle_back_off, "
    "int[]? enableConvDithering) -> ()",
    "push_name_scope": "(str name) -> ()",
    "pop_name_scope": "() -> ()",
    "set_attribute": "(str attribute, str key, str value) -> ()",
    "clear_attribute": "(str attribute, str key) -> ()",
    "ipu_print_tensor": "(Tensor self, str title, int print_gradient, int summarize_threshold, "
    "int edge_items, int max_line_width, int digits, int float_format, str separator, "
    "str open_bracket, str close_bracket) -> Tensor",
    "nop": "(Tensor self) -> Tensor",
    "end_for_loop": "(Tensor[] outputs, Tensor[] inputs, int trip_count) -> Tensor[]",
    "end_if_block": "(Tensor[] outputs, Tensor condition) -> Tensor[]",
    "set_matmul_serialization": "(Tensor matmul, str mode, int factor, bool keep_precision) "
    "-> Tensor",
    "set_overlap_for_input": "(Tensor t, str mode) -> Tensor",
    "set_overlap_for_output": "(Tensor t, str mode) -> Tensor",
    "recomputation_checkpoint": "(Tensor self) -> Tensor",
    "set_available_memory": "(Tensor t, float mem) -> Tensor",
    "custom_operation": "(Tensor[] inputs, str name, str domain, int domain_version, "
    "int num_outputs, Tensor[] outputs, str attributes) -> Tensor[]",
    "ctc_beam_search_decoder": "(Tensor probs, Tensor lengths, int blank, int beam_width, "
    "int top_paths) -> (Tensor, Tensor, Tensor)",
    "dynamic_slice": "(Tensor self, int dim, Tensor start, int size, int step) -> Tensor",
    "dynamic_update": "(Tensor self, Tensor src, int dim, Tensor start, int size) -> Tensor",
    "identity_loss": "(Tensor x, int reduction) -> Tensor",
    "internal_cast": "(Tensor self, str dtype) -> Tensor",
    "end_cpu_op": "(Tensor[] output) -> Tensor[]",
    "call_cpu_op": "(Tensor[] inputs, str name) -> ()",
    "fps": "(Tensor src, int[] ptr, float ratio, bool random_start) -> Tensor",
    "nearest": "(Tensor x, Tensor y, Tensor batch_x, Tensor batch_y) -> Tensor",
    "nearest_batch_list": "(Tensor x, Tensor y, int[] batch_x, int[] batch_y) -> Tensor",
}

# The integer codes PopTorch's Python wrappers pass for strings.
FLOAT_FORMATS = ("auto", "fixed", "scientific", "none")
REDUCTIONS = ("sum", "mean", "none")
_CASTS = {"FLOAT": torch.float32, "FLOAT32": torch.float32, "FLOAT16": torch.float16}
_MATMUL_MODES = ("input_channels", "output_channels", "reducing_dim", "none")

LIBRARY = torch.library.Library("poptorch", "DEF")


def _symbolic(*tensors: torch.Tensor) -> bool:
    """Whether the kernel runs on fake tensors (a capture learning shapes), not on data."""
    return any(is_fake(t) or t.device.type == "meta" for t in tensors)


def _begin_ipu_block(stage_id: int, phase_id: int, ipu_id: int) -> None:
    recorder = blocks.active_recorder()
    if recorder is not None:
        # A stage id names one block: entering it again continues that block, as on an IPU.
        recorder.begin_block(str(stage_id), ipu_id)


def _end_ipu_block() -> None:
    recorder = blocks.active_recorder()
    if recorder is not None:
        recorder.end_block()


def _push_name_scope(name: str) -> None:
    NameScope(name).__enter__()


def _pop_name_scope() -> None:
    if not name_scope_depth():  # the stack, not its names: ``push_name_scope("")`` opens one
        raise createPoptorchError(
            "pop_name_scope: no name scope is open (each pop_name_scope must follow a "
            "push_name_scope)."
        )
    NameScope("").__exit__()


def _set_attribute(attribute: str, key: str, value: str) -> None:
    Attribute._current_attrs.setdefault(attribute, {})[key] = value


def _clear_attribute(attribute: str, key: str) -> None:
    current = Attribute._current_attrs
    current.get(attribute, {}).pop(key, None)
    if not current.get(attribute, True):
        del current[attribute]


def _nothing(*args: object) -> None:
    """Markers for PopART's scheduler and optimizer: nothing to do off the IPU."""


def _identity(t: torch.Tensor, *args: object) -> torch.Tensor:
    return t


def _first(outputs: list[torch.Tensor], *args: object) -> list[torch.Tensor]:
    return list(outputs)


def _set_matmul_serialization(t: torch.Tensor, mode: str, factor: int, keep: bool) -> torch.Tensor:
    if mode not in _MATMUL_MODES:
        raise createPoptorchError(
            f"Invalid serialization mode '{mode}' for set_matmul_serialization (expected one "
            f"of: {', '.join(_MATMUL_MODES)})."
        )
    if factor < 1:
        raise createPoptorchError(f"Invalid serialization factor {factor}: it must be >= 1.")
    return t


def _ipu_print_tensor(
    t: torch.Tensor,
    title: str,
    print_gradient: int,
    summarise_threshold: int,
    edge_items: int,
    max_line_width: int,
    digits: int,
    float_format: int,
    separator: str,
    open_bracket: str,
    close_bracket: str,
) -> torch.Tensor:
    if not 0 <= float_format < len(FLOAT_FORMATS):
        raise KeyError(f"float_format code must be 0 to 3 ({', '.join(FLOAT_FORMATS)})")
    if _symbolic(t):
        return t.clone()
    return printing.ipu_print_tensor(
        t,
        title,
        bool(print_gradient),
        summarise_threshold,
        edge_items,
        max_line_width,
        digits,
        FLOAT_FORMATS[float_format],
        separator,
        open_bracket,
        close_bracket,
    )


def _dynamic_slice(
    t: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    if _symbolic(t, start):
        shape = list(t.shape)
        shape[dim] = math.ceil(size / step)
        return t.new_empty(shape)
    return slicing.dynamic_slice(t, dim, start, size, step)


def _dynamic_update(
    t: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> torch.Tensor:
    if _symbolic(t, src, start):
        return torch.empty_like(t)
    return slicing.dynamic_update(t, src, dim, start, size)


def _identity_loss(x: torch.Tensor, reduction: int) -> torch.Tensor:
    if not 0 <= reduction < len(REDUCTIONS):
        raise createPoptorchError(
            f"reduction must be sum (0), mean (1) or none (2); got {reduction}"
        )
    # Not ``loss.identity_loss``: its loss hook would record the result a second time, beside
    # the TorchFunctionMode loss recorders that already see this op (``register_loss_op``).
    return x.sum() if reduction == 0 else x.mean() if reduction == 1 else x.view_as(x)


def _internal_cast(t: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype not in _CASTS:
        raise ValueError(
            f"Invalid poptorch.cast target type {dtype!r}. Expecting torch.float or torch.half "
            "('FLOAT', 'FLOAT32' or 'FLOAT16')."
        )
    return t.to(_CASTS[dtype])


def _custom_operation(
    inputs: list[torch.Tensor],
    name: str,
    domain: str,
    domain_version: int,
    num_outputs: int,
    outputs: list[torch.Tensor],
    attributes: str,
) -> list[torch.Tensor]:
    if _symbolic(*inputs, *outputs):
        return [torch.empty_like(o) for o in outputs]
    results = _lookup(name, domain, domain_version)(*inputs)
    return list(results) if isinstance(results, (list, tuple)) else [results]


def _ctc_beam_search_decoder(
    probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_width: int, top_paths: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _symbolic(probs, lengths):
        if probs.dim() != 3:
            raise createPoptorchError(
                "Incorrect shape for first input to CTC beam search decoder."
            )
        time, batch, _ = probs.shape
        return (
            probs.new_empty(batch, top_paths),
            probs.new_empty(batch, top_paths, dtype=torch.int32),
            probs.new_empty(batch, top_paths, time, dtype=torch.int32),
        )
    found = misc.ctc_beam_search_decoder(probs, lengths, blank, beam_width, top_paths)
    return found[0], found[1], found[2]


def _fps(src: torch.Tensor, ptr: list[int], ratio: float, random_start: bool) -> torch.Tensor:
    if _symbolic(src):
        degrees = [b - a for a, b in zip(ptr[:-1], ptr[1:])]
        count = sum(math.ceil(float(torch.tensor(d * ratio, dtype=src.dtype))) for d in degrees)
        return src.new_empty(count, dtype=torch.long)
    return misc.fps(src, list(ptr), float(ratio), bool(random_start))


def _nearest(
    x: torch.Tensor, y: torch.Tensor, batch_x: torch.Tensor, batch_y: torch.Tensor
) -> torch.Tensor:
    if _symbolic(x, y, batch_x, batch_y):
        return x.new_empty(x.shape[0], dtype=torch.long)
    return misc.nearest(x, y, batch_x, batch_y)


def _nearest_batch_list(
    x: torch.Tensor, y: torch.Tensor, batch_x: Sequence[int], batch_y: Sequence[int]
) -> torch.Tensor:
    if _symbolic(x, y):
        return x.new_empty(x.shape[0], dtype=torch.long)
    return misc.nearest(x, y, list(batch_x), list(batch_y))


_KERNELS = {
    "begin_ipu_block": _begin_ipu_block,
    "end_ipu_block": _end_ipu_block,
    "start_for_loop": _nothing,
    "start_if_block": _nothing,
    "start_else_block": _nothing,
    "optimizer_group": _nothing,
    "begin_multi_conv": _nothing,
    "end_multi_conv": _nothing,
    "push_name_scope": _push_name_scope,
    "pop_name_scope": _pop_name_scope,
    "set_attribute": _set_attribute,
    "clear_attribute": _clear_attribute,
    "ipu_print_tensor": _ipu_print_tensor,
    "nop": _identity,
    "end_for_loop": _first,
    "end_if_block": _first,
    "set_matmul_serialization": _set_matmul_serialization,
    "set_overlap_for_input": _identity,
    "set_overlap_for_output": _identity,
    "recomputation_checkpoint": _identity,
    "set_available_memory": _identity,
    "custom_operation": _custom_operation,
    "ctc_beam_search_decoder": _ctc_beam_search_decoder,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update": _dynamic_update,
    "identity_loss": _identity_loss,
    "internal_cast": _internal_cast,
    "end_cpu_op": _first,
    "call_cpu_op": _nothing,
    "fps": _fps,
    "nearest": _nearest,
    "nearest_batch_list": _nearest_batch_list,
}

for _name, _schema in SCHEMAS.items():
    LIBRARY.define(_name + _schema)
    LIBRARY.impl(_name, _KERNELS[_name], "CompositeImplicitAutograd")

loss.register_loss_op(torch.ops.poptorch.identity_loss)

# The ops without outputs: a capture that records them as nodes may drop them once captured.
CAPTURE_ONLY = frozenset(
    getattr(torch.ops.poptorch, name).default
    for name, schema in SCHEMAS.items()
    if schema.endswith("-> ()")
)
