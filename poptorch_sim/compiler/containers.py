"""Output objects torch's pytree does not know, made flat for capture: transformers' KV caches.

[Note: cache objects in the outputs]
A ``transformers`` decoder with its default config (``use_cache=True``) returns a ``Cache``
object among its outputs: ``DynamicCache`` (GPT-2, Llama) or ``EncoderDecoderCache`` (T5), each
holding every layer's keys and values. torch's pytree sees such an object as one opaque leaf,
so ``torch.export`` refuses it ("Found DynamicCache in output, which is not a known type") and
the model could not be split. transformers' own remedy
(``integrations.executorch.register_dynamic_cache_export_support``) registers ``DynamicCache``
as a pytree node for the whole process and covers neither ``EncoderDecoderCache`` nor the
layers it has not met; capture must not change how the user's own code flattens their objects.

So capture wraps each cache it finds in the outputs in a private node class, registered once
with pytree here, whose children are the cache's tensors and whose unflatten builds a cache of
the same class again (the ``TreeSpec`` of the outputs carries the wrapper's type, never the
user's)::

    forward returns                    leaves of the program          the caller gets
    DynamicCache(layers 0..n-1)        keys 0..n-1, values 0..n-1      DynamicCache, same layers
    EncoderDecoderCache(self, cross)   the two DynamicCaches' leaves   EncoderDecoderCache

Each key/value tensor is ``[batch, heads, tokens, head_dim]``, so the output streams join it over
micro-batches like any other batch-major output, and the caller's cache holds the whole batch,
as eager's does. A sliding-window layer keeps its window (an ``int`` in the spec's context, not
a leaf). Cache classes not listed here (static, quantized, offloaded) stay opaque: capture then
fails with a message naming the class.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["flat_outputs"]


class _DynamicCacheLeaves:
    """A ``DynamicCache`` during capture: each layer's keys and values, and its window."""

    def __init__(self, cache: Any) -> None:
        self.keys = [layer.keys for layer in cache.layers]
        self.values = [layer.values for layer in cache.layers]
        self.windows = tuple(getattr(layer, "sliding_window", None) for layer in cache.layers)


def _flatten_dynamic(node: _DynamicCacheLeaves) -> tuple[list[torch.Tensor], Any]:
    present = tuple(k is not None and v is not None for k, v in zip(node.keys, node.values))
    keys = [k for k, ok in zip(node.keys, present) if ok]
    values = [v for v, ok in zip(node.values, present) if ok]
    return [*keys, *values], (node.windows, present)


def _unflatten_dynamic(children: Any, context: Any) -> Any:
    from transformers.cache_utils import DynamicCache

    windows, present = context
    half = len(children) // 2
    keys, values = iter(children[:half]), iter(children[half:])
    layers = []
    for window, ok in zip(windows, present):
        kv = (next(keys), next(values)) if ok else (None, None)
        if window is not None:
            kv = (*kv, torch.tensor(window, dtype=torch.long))
        layers.append(kv)
    return DynamicCache(layers)


class _EncoderDecoderCacheLeaves:
    """An ``EncoderDecoderCache`` during capture: its self- and cross-attention caches."""

    def __init__(self, cache: Any) -> None:
        self.self_attention = _DynamicCacheLeaves(cache.self_attention_cache)
        self.cross_attention = _DynamicCacheLeaves(cache.cross_attention_cache)


def _flatten_encoder_decoder(node: _EncoderDecoderCacheLeaves) -> tuple[list[Any], Any]:
    return [node.self_attention, node.cross_attention], None


def _unflatten_encoder_decoder(children: Any, _context: Any) -> Any:
    from transformers.cache_utils import EncoderDecoderCache

    return EncoderDecoderCache(*children)


pytree.register_pytree_node(
    _DynamicCacheLeaves,
    _flatten_dynamic,
    _unflatten_dynamic,
    serialized_type_name="poptorch_sim.DynamicCacheLeaves",
)
pytree.register_pytree_node(
    _EncoderDecoderCacheLeaves,
    _flatten_encoder_decoder,
    _unflatten_encoder_decoder,
    serialized_type_name="poptorch_sim.EncoderDecoderCacheLeaves",
)


def _cache_classes() -> tuple[type, type] | None:
    """transformers' ``DynamicCache`` and ``EncoderDecoderCache``, if transformers is loaded."""
    module = sys.modules.get("transformers.cache_utils")
    if module is None:
        return None
    return module.DynamicCache, module.EncoderDecoderCache


def _is_plain(cache: Any) -> bool:
    """Whether every layer is a dynamic (maybe sliding-window) layer holding keys and values."""
    from transformers.cache_utils import DynamicLayer

    if getattr(cache, "offloading", False):
        return False
    return all(isinstance(layer, DynamicLayer) for layer in cache.layers)


def _wrap(leaf: Any) -> Any:
    classes = _cache_classes()
    if classes is None:
        return leaf
    dynamic, encoder_decoder = classes
    if type(leaf) is dynamic and _is_plain(leaf):
        return _DynamicCacheLeaves(leaf)
    if (
        type(leaf) is encoder_decoder
        and type(leaf.self_attention_cache) is dynamic
        and type(leaf.cross_attention_cache) is dynamic
        and _is_plain(leaf.self_attention_cache)
        and _is_plain(leaf.cross_attention_cache)
    ):
        return _EncoderDecoderCacheLeaves(leaf)
    return leaf


def flat_outputs(outputs: Any) -> Any:
    """``outputs`` with every cache object wrapped so pytree flattens it into its tensors.

    See [Note: cache objects in the outputs].

    >>> flat_outputs((torch.ones(1), 2))  # nothing to wrap
    (tensor([1.]), 2)
    """
    return pytree.tree_map(_wrap, outputs)
