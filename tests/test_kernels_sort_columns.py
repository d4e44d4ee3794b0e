"""Rows whose network sorts column chunks first (see [Note: column chunks] in
csrc/sort/bitonic/steps.inc), on 64-bit and 32-bit items, against torch.sort."""

from __future__ import annotations

import pytest
import torch
from test_kernels_sort_short import (
    LEVELS,
    _check,
    _check_8_lanes,
    _nan_and_zeros,
    _ordered_keys,
    _rows,
    _same_bits_at_every_level,
    needs_8_lanes,
)

from poptorch_sim import kernels

# Padded sizes of 16W ... 64W items and past them, for W = 2, 4, 8 (and 8 and 16 32-bit lanes):
# one chunk of 16 columns held in registers, chunks of 32 and 64 columns (merged through a
# scratch chunk), and rows of several chunks; with their neighbours, which pad to the next size.
LENGTHS = [32, 33, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 511, 512, 1024, 2048, 4096]
DTYPES = [torch.float32, torch.int32, torch.float16, torch.bfloat16, torch.int16, torch.float64]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_column_chunks_match_stable_torch_sort(level: str, dtype: torch.dtype) -> None:
    with kernels.simd(level):
        for n in LENGTHS:
            _check(_rows(3, n, dtype, seed=n), descending=n % 2 == 1)
            _check(_rows(2, n, dtype, seed=n + 1), descending=n % 2 == 0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n", [128, 256, 1024], ids=lambda n: f"n{n}")
def test_column_chunks_of_ordered_and_repeated_keys(level: str, n: int) -> None:
    with kernels.simd(level):
        for x in _ordered_keys(n, period=16):
            for dtype in (torch.float32, torch.int16, torch.bfloat16):
                _check(x.to(dtype).repeat(2, 1))
                _check(x.to(dtype).repeat(2, 1), descending=True)
        _check(torch.full((2, n), float("nan")))
        _check(_nan_and_zeros(n))
        _check(_nan_and_zeros(n).half(), descending=True)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int16], ids=str)
def test_long_rows_of_16_bit_keys(level: str, dtype: torch.dtype) -> None:
    # 32-bit items (see [Note: 16-bit keys]): column chunks of 8 lanes with AVX2, the whole
    # network on rows of every length (they are not cut into pieces).
    with kernels.simd(level):
        for n in (513, 600, 819, 820, 1100, 3001, 8191, 8192, 20_000, 32768):
            x = _rows(2, n, dtype, seed=n)
            _check(x, descending=n % 2 == 1)
            _check(x.sort(dim=1).values, descending=n % 2 == 0)  # sorted rows
        up = torch.arange(32768) % 7
        _check(up.to(dtype).repeat(2, 1))  # few keys
        _check(torch.zeros(2, 32768, dtype=dtype), descending=True)


def test_column_chunks_give_the_same_bits_at_every_level() -> None:
    _same_bits_at_every_level(
        [_rows(3, n, dtype, seed=n) for n in (128, 256, 1024, 20_000) for dtype in DTYPES]
    )


@needs_8_lanes
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.int64], ids=str)
def test_8_lane_network_sorts_column_chunks(dtype: torch.dtype) -> None:
    for n in LENGTHS:
        _check_8_lanes(_rows(2, n, dtype, seed=n), descending=n % 2 == 1)
