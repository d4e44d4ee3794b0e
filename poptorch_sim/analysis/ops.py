"""What each op of a stage's forward costs: FLOPs, bytes moved and its kind, counted on fake tensors.

``OpCounter`` is a dispatch mode entered inside the fake (or real) forward that the memory
estimate already runs per stage (``memory/activations.py``), so shapes and dtypes are those of
the compiled program and nothing is computed. Each aten op is put in one of four kinds:

=========  ==========================================================================  ========
kind       ops                                                                          cost
=========  ==========================================================================  ========
compute    ops ``torch.utils.flop_counter`` counts (matmuls, convolutions, attention)  FLOPs on
                                                                                        the AMP
view       views and metadata (``view``, ``transpose``, ``detach`` ...), PopTorch's    nothing
           markers (``poptorch.push_name_scope`` ...)
memory     pointwise ops (``torch.Tag.pointwise``), reductions, norms, copies, gathers  bytes
unknown    anything else (custom ops among them): counted as ``memory``, by the bytes   bytes
           of its inputs and outputs, and named once in a warning
=========  ==========================================================================  ========
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "OpTotals", "op_kind"]

# Memory-bound aten ops that carry no ``pointwise`` tag (by overload packet name).
_MEMORY_OPS = frozenset(
    """
    sum mean amax amin max min var var_mean std std_mean prod norm linalg_vector_norm argmax argmin
    cumsum cumprod logsumexp softmax _softmax _safe_softmax log_softmax _log_softmax
    _softmax_backward_data
    native_layer_norm native_batch_norm _native_batch_norm_legit
    _native_batch_norm_legit_functional _native_batch_norm_legit_no_training native_group_norm
    layer_norm batch_norm group_norm embedding embedding_dense_backward index_select gather
    scatter scatter_add index index_put index_put_ index_add masked_fill masked_scatter
    where clone copy copy_ _to_copy to contiguous cat stack constant_pad_nd pad repeat
    fill fill_ zero_ zeros_like ones_like empty_like full_like new_zeros new_ones new_empty
    new_full full zeros ones empty empty_strided arange scalar_tensor lift_fresh_copy
    max_pool2d_with_indices avg_pool2d adaptive_avg_pool2d _adaptive_avg_pool2d
    max_pool2d_with_indices_backward upsample_nearest2d upsample_bilinear2d
    native_dropout bernoulli bernoulli_ rand rand_like randn randn_like uniform_ normal_
    topk sort argsort nll_loss_forward nll_loss2d_forward cross_entropy_loss mse_loss
    binary_cross_entropy binary_cross_entropy_with_logits one_hot roll flip tril triu
    slice_scatter select_scatter diagonal_scatter as_strided_scatter _unsafe_index
    """.split()
)

# Ops that only read or change metadata: no bytes move.
_VIEW_OPS = frozenset(
    """
    detach alias lift_fresh _unsafe_view view reshape t transpose permute expand unsqueeze
    squeeze slice select split split_with_sizes unbind chunk as_strided narrow movedim
    _reshape_alias unfold view_as sym_size sym_stride sym_numel sym_storage_offset
    set_ resize_ _local_scalar_dense item is_same_size _has_compatible_shallow_copy_type
    device layout dim
    """.split()
)


# PopTorch's own ops that only mark the graph for PopART (scopes, blocks, attributes) or pass
# their input through unchanged: nothing is computed or moved.
_POPTORCH_MARKERS = frozenset(
    """
    begin_ipu_block end_ipu_block push_name_scope pop_name_scope set_attribute clear_attribute
    optimizer_group begin_multi_conv end_multi_conv nop recomputation_checkpoint
    set_available_memory set_matmul_serialization set_overlap_for_input set_overlap_for_output
    """.split()
)


# Attention kernels flop_counter leaves out (CPU's): (query, key, value) are their first inputs.
_ATTENTION = frozenset(("_scaled_dot_product_flash_attention_for_cpu",))


@functools.cache
def _flop_counter() -> Any:
    """``torch.utils.flop_counter``, imported on first use: it imports triton (about 0.2 s),
    which a process that never counts an op's FLOPs need not load."""
    import torch.utils.flop_counter

    return torch.utils.flop_counter


def op_kind(func: Any) -> str:
    """``"compute"``, ``"view"``, ``"memory"`` or ``"unknown"`` for an aten op overload."""
    packet = getattr(func, "overloadpacket", None)
    name = getattr(packet, "__name__", str(func))
    if packet in _flop_counter().flop_registry or name in _ATTENTION:
        return "compute"
    if name in _VIEW_OPS or getattr(func, "is_view", False):
        return "view"
    if getattr(func, "namespace", "") == "poptorch" and name in _POPTORCH_MARKERS:
        return "view"
    tags = getattr(func, "tags", ())
    if torch.Tag.pointwise in tags or name in _MEMORY_OPS or name.rstrip("_") in _MEMORY_OPS:
        return "memory"
    return "unknown"


def _flops(func: Any, args: Any, kwargs: Any, out: Any) -> int:
    packet, counter = func.overloadpacket, _flop_counter()
    if packet in counter.flop_registry:
        return int(counter.flop_registry[packet](*args, **kwargs, out_val=out))
    q, k, v = args[:3]
    return int(counter.sdpa_flop_count(q.shape, k.shape, v.shape))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class OpTotals:
    """One forward of a stage for one micro-batch, summed by kind.

    Attributes:
        flops: FLOPs of matmuls (and attention) by dtype name (``"float16"``, ``"float32"``).
        conv_flops: FLOPs of convolutions by dtype name.
        compute_bytes: bytes compute ops read and write (their operands: exchanged to tiles).
        memory_bytes: bytes memory-bound (and unknown) ops read and write.
        ops: ops that cost something (compute, memory and unknown).
        compute_ops: the compute ops among them.
        unknown: the unknown ops' names, with how often each ran.
    """

    flops: dict[str, int] = field(default_factory=dict)
    conv_flops: dict[str, int] = field(default_factory=dict)
    compute_bytes: int = 0
    memory_bytes: int = 0
    ops: int = 0
    compute_ops: int = 0
    unknown: dict[str, int] = field(default_factory=dict)

    @property
    def total_flops(self) -> int:
        """FLOPs of every dtype, matmuls and convolutions."""
        return sum(self.flops.values()) + sum(self.conv_flops.values())

    def add(self, other: OpTotals) -> None:
        """Add ``other``'s counts to these."""
        for mine, theirs in ((self.flops, other.flops), (self.conv_flops, other.conv_flops)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.compute_bytes += other.compute_bytes
        self.memory_bytes += other.memory_bytes
        self.ops += other.ops
        self.compute_ops += other.compute_ops
        for k, v in other.unknown.items():
            self.unknown[k] = self.unknown.get(k, 0) + v


class OpCounter(TorchDispatchMode):
    """Counts the ops run under it into ``totals`` (enter it inside ``FakeTensorMode``).

    >>> # with FakeTensorMode(), OpCounter() as c: model(x); print(c.totals.total_flops)
    """

    def __init__(self) -> None:
        super().__init__()
        self.totals = OpTotals()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._record(func, args, kwargs, out)
        except Exception:  # a count must never break the forward it watches
            self.totals.unknown[str(func)] = self.totals.unknown.get(str(func), 0) + 1
        return out

    def _record(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        kind = op_kind(func)
        if kind == "view":
            return
        tensors = [
            t for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)
        ]
        nbytes = sum(_nbytes(t) for t in tensors)
        totals = self.totals
        totals.ops += 1
        if kind == "compute":
            flops = _flops(func, args, kwargs, out)
            dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else "float32"
            into = totals.conv_flops if "conv" in str(func.overloadpacket) else totals.flops
            into[dtype] = into.get(dtype, 0) + flops
            totals.compute_bytes += nbytes
            totals.compute_ops += 1
            return
        totals.memory_bytes += nbytes
        if kind == "unknown":
            name = str(getattr(func, "overloadpacket", func))
            totals.unknown[name] = totals.unknown.get(name, 0) + 1
