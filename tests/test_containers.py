"""Capture's flattening of transformers' cache objects (``compiler/containers.py``): a round trip
through pytree gives back a cache of the same class holding the same tensors, and the user's
own pytree registry is left as it was."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from poptorch_sim.compiler.containers import flat_outputs

cache_utils = pytest.importorskip("transformers.cache_utils")


def _layer(batch: int = 2, tokens: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 4, tokens, 8), torch.randn(batch, 4, tokens, 8)


def _round_trip(outputs: object) -> object:
    leaves, spec = pytree.tree_flatten(flat_outputs(outputs))
    assert all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    return pytree.tree_unflatten(leaves, spec)


def test_dynamic_cache_round_trips_with_its_layers() -> None:
    cache = cache_utils.DynamicCache([_layer(), _layer()])
    logits = torch.randn(2, 5)
    out_logits, out_cache = _round_trip((logits, cache))
    assert out_logits is logits
    assert type(out_cache) is cache_utils.DynamicCache
    assert out_cache.get_seq_length() == 3
    for ours, theirs in zip(out_cache.layers, cache.layers):
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)


def test_sliding_window_and_empty_layers_keep_their_shape() -> None:
    k, v = _layer(tokens=2)
    cache = cache_utils.DynamicCache([(k, v, torch.tensor(4)), (None, None)])
    leaves, _spec = pytree.tree_flatten(flat_outputs(cache))
    assert len(leaves) == 2  # the window is context, the empty layer holds nothing
    out = _round_trip(cache)
    assert isinstance(out.layers[0], cache_utils.DynamicSlidingWindowLayer)
    assert out.layers[0].sliding_window == 4
    assert torch.equal(out.layers[0].keys, k) and torch.equal(out.layers[0].values, v)
    assert not out.layers[1].is_initialized


def test_encoder_decoder_cache_round_trips() -> None:
    self_attention = cache_utils.DynamicCache([_layer(), _layer()])
    cross_attention = cache_utils.DynamicCache([_layer(tokens=5), _layer(tokens=5)])
    cache = cache_utils.EncoderDecoderCache(self_attention, cross_attention)
    out = _round_trip({"past_key_values": cache})["past_key_values"]
    assert type(out) is cache_utils.EncoderDecoderCache
    assert out.self_attention_cache.get_seq_length() == 3
    assert out.cross_attention_cache.get_seq_length() == 5
    assert out.is_updated == cache.is_updated == {0: True, 1: True}


def test_the_users_pytree_still_sees_a_cache_as_one_leaf() -> None:
    cache = cache_utils.DynamicCache([_layer()])
    flat_outputs(cache)
    assert pytree.tree_leaves(cache) == [cache]
