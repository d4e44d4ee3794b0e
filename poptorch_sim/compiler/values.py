"""Which traced values are not tensors (sizes, shapes, dtypes, Python numbers).

Read from the graph's structure, without running anything: a value is not a tensor when it
comes from a tensor query (``x.size(0)``, ``x.shape``, ``x.dim()``, ``len(x)``, ...) or from
Python arithmetic / indexing on such values only. Everything else counts as a tensor. The
runtime must pass these values between stages as they are (no detach, no gradient).

    n = x.size(0)        not a tensor      y = x.view(n, -1)   tensor
    s = x.shape[1] * 2   not a tensor      z = y + n           tensor
"""

from __future__ import annotations

import builtins
import operator

import torch.fx as fx

__all__ = ["non_tensor_values"]

_QUERY_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "item",
        "tolist",
        "stride",
        "storage_offset",
        "get_device",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "__len__",
    }
)
_QUERY_ATTRIBUTES = frozenset(
    {"shape", "dtype", "device", "ndim", "layout", "requires_grad", "is_cuda", "names"}
)
_PYTHON_OPERATORS = frozenset(
    getattr(operator, name)
    for name in (
        "getitem add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge "
        "and_ or_ xor not_ invert lshift rshift"
    ).split()
)


def _is_query(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _QUERY_METHODS
    if node.op != "call_function":
        return False
    if node.target is builtins.getattr:
        return len(node.args) > 1 and node.args[1] in _QUERY_ATTRIBUTES
    return node.target is builtins.len


def non_tensor_values(graph: fx.Graph) -> frozenset[str]:
    """Names of the nodes of ``graph`` whose values are known not to be tensors."""
    found: set[fx.Node] = set()
    for node in graph.nodes:
        if _is_query(node):
            found.add(node)
        elif node.op == "call_function" and node.target in _PYTHON_OPERATORS:
            inputs = node.all_input_nodes
            if inputs and all(arg in found for arg in inputs):
                found.add(node)
    return frozenset(node.name for node in found)
