"""Long short-rows cut into pieces by quicksort partitions (see [Note: partitioned rows] in
csrc/sort/bitonic/pieces.inc) against torch.sort, at every SIMD level."""

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
    _wide_rows,
    needs_8_lanes,
)

from poptorch_sim import kernels

# Rows partitioned (longer than 512 items and padded by at least a fifth, or of at least 8192
# items) and, around the boundaries, rows the whole network sorts: 512, 820, 4096.
LENGTHS = [512, 513, 600, 819, 820, 1100, 2049, 3001, 4096, 8191, 8192, 20_000, 32768]
DTYPES = [torch.float32, torch.int32, torch.int16, torch.float16, torch.int64, torch.float64]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_partitioned_rows_match_stable_torch_sort(level: str, dtype: torch.dtype) -> None:
    with kernels.simd(level):
        for n in LENGTHS:
            x = _rows(2, n, dtype, seed=n)
            _check(x, descending=n % 2 == 1)
            _check(x[:, torch.randperm(n)], descending=n % 2 == 0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n", [3001, 32768], ids=lambda n: f"n{n}")
def test_partitioned_rows_of_ordered_and_repeated_keys(level: str, n: int) -> None:
    # Every partition's pivot is an item of its piece (keys and indices make items distinct), so
    # sorted, reversed, organ-pipe rows and rows of few distinct keys are cut like random ones.
    with kernels.simd(level):
        for x in _ordered_keys(n, period=64):
            _check(x.float().repeat(2, 1))
            _check(x.float().repeat(2, 1), descending=True)
            _check(x.to(torch.int64).repeat(2, 1) << 35, descending=True)  # span > 2^32
            _check(x.double().repeat(2, 1) * 1e300)
        _check(torch.full((2, n), float("nan")))
        _check(_nan_and_zeros(n))
        _check(_nan_and_zeros(n), descending=True)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=str)
def test_partitioned_wide_keys_with_runs_of_equal_windows(level: str, dtype: torch.dtype) -> None:
    # 64-bit keys spanning more than 2^32 that differ in their low bits only: the pieces leave runs
    # of equal windows for the tie sort (see [Note: wide keys] in csrc/sort/bitonic/row_loops.inc).
    x = _wide_rows(dtype, seed=31)  # rows of 3000
    long_rows = torch.cat([x, x.flip(1), x], dim=1)[:2, :8200]
    with kernels.simd(level):
        _check(x)
        _check(x, descending=True)
        _check(long_rows)
        _check(long_rows, descending=True)


def test_partitioned_rows_give_the_same_bits_at_every_level() -> None:
    cases = [_rows(3, n, dtype, seed=n) for n in (600, 3001, 20_000) for dtype in DTYPES]
    cases += [_wide_rows(dtype, seed=32) for dtype in (torch.int64, torch.float64)]
    _same_bits_at_every_level(cases)


@needs_8_lanes
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.int64], ids=str)
def test_8_lane_network_cuts_partitioned_rows(dtype: torch.dtype) -> None:
    for n in (513, 3001, 8192, 32768):
        _check_8_lanes(_rows(2, n, dtype, seed=n), descending=n % 2 == 1)
