"""Rows of up to 1024 values sorted as 32-bit items holding a window of each key and its index
(see [Note: windowed 32-bit items] in csrc/sort/bitonic/window_rows.inc), against torch.sort:
float32 and int32 rows past 64, int64 and float64 rows past 16; keys that share a window, spans
of every width, NaN and -0.0, and every SIMD level."""

from __future__ import annotations

import pytest
import torch
from test_kernels_sort_short import LEVELS, _check, _nan_and_zeros, _same_bits_at_every_level

from poptorch_sim import kernels

# Past kWindowRowMin (64) up to kWindowRowMax (1024): lengths that fill whole vectors of 8 and 16
# lanes and lengths with a tail, padded to a power of two or not, with indices of 8 bits (up to
# 256) or more.
LENGTHS = [65, 100, 127, 128, 129, 200, 255, 256, 257, 300, 512, 513, 1000, 1024]
# 64-bit keys: from past kRun (16).
WIDE_LENGTHS = [17, 31, 32, 33, 64, *LENGTHS]


def _shared_windows(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Three rows of n that span more than 2^24 keys (a window drops the low bits), made of clusters
    of keys that differ in their lowest bits only: one of up to 200 neighbours, pairs and triples
    at other magnitudes, and repeats; shuffled."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(3):
        big = min(200, n // 2)
        if dtype == torch.int32:
            start = int(torch.randint(-(2**30), 2**30, (1,), generator=g))
            cluster = start + torch.randint(0, 256, (big,), generator=g)
            small = torch.randint(-(2**31), 2**31 - 8, (n - big - 2,), generator=g)
            small[1::3] = small[::3][: small[1::3].numel()] + 1  # neighbours of other keys
            ends = torch.tensor([-(2**31), 2**31 - 1])
            row = torch.cat([cluster, small, ends]).to(torch.int32)
        else:
            ulps = torch.randint(0, 256, (big,), generator=g, dtype=torch.int32)
            cluster = (torch.tensor(1.5).view(torch.int32) + ulps).view(torch.float32)
            cluster[: big // 2] = -cluster[: big // 2]
            small = torch.randn(n - big - 2, generator=g) * 1000
            after = torch.nextafter(small, torch.tensor(float("inf")))
            small[1::3] = after[::3][: small[1::3].numel()]  # neighbours of other values
            ends = torch.tensor([-3.0e38, 3.0e38])
            row = torch.cat([cluster, small, ends])
        rows.append(row[torch.randperm(n, generator=g)])
    return torch.stack(rows)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.int32, torch.int64, torch.float64], ids=str
)
def test_keys_sharing_a_window_are_sorted_by_whole_key(level: str, dtype: torch.dtype) -> None:
    # Runs of equal windows, long and short, anywhere in the row: only the sort of the runs
    # after the network orders them by their low bits.
    wide = dtype.itemsize == 8
    make = _wide_shared_windows if wide else _shared_windows
    with kernels.simd(level):
        for n in WIDE_LENGTHS if wide else LENGTHS:
            x = make(n, dtype, seed=n)
            _check(x)
            _check(x, descending=True)


@pytest.mark.parametrize("level", LEVELS)
def test_spans_below_and_above_a_window(level: str) -> None:
    # Small integers (the window is the whole key), a span of exactly 2^24 keys, the full int32
    # range with its largest key last in a row of 256 (the item equal to the padding, in a row
    # that has none) and one short of it.
    g = torch.Generator().manual_seed(5)
    with kernels.simd(level):
        for n in LENGTHS:
            _check(torch.randint(-50, 50, (4, n), generator=g, dtype=torch.int32))
            spans = torch.randint(0, 2**24, (2, n), generator=g, dtype=torch.int32)
            spans[:, :2] = torch.tensor([0, 2**24 - 1], dtype=torch.int32)
            _check(spans, descending=True)
            ends = torch.randint(-(2**31), 2**31 - 1, (2, n), generator=g, dtype=torch.int32)
            ends[:, 0] = -(2**31)
            ends[:, -1] = 2**31 - 1
            _check(ends)
            _check(-1 - ends, descending=True)


@pytest.mark.parametrize("level", LEVELS)
def test_nan_zeros_and_infinities_read_back_from_the_input(level: str) -> None:
    # Values are read from the input by index: NaN payloads of both signs and -0.0 come back as
    # they were, -0.0 and 0.0 tie in index order.
    g = torch.Generator().manual_seed(6)
    with kernels.simd(level):
        for n in LENGTHS:
            _check(_nan_and_zeros(n))
            x = torch.randn(3, n, generator=g)
            x[:, ::5] = float("nan")
            x[:, 1::5] = -x[:, 1::5].abs() * float("nan")
            x[:, 2::7] = -0.0
            x[:, 3::7] = float("-inf")
            x[:, 4::9] = 0.0
            _check(x)
            _check(x, descending=True)


def test_every_level_gives_the_same_bits() -> None:
    cases = [
        _shared_windows(n, dtype, seed=n + 1)
        for n in LENGTHS
        for dtype in (torch.float32, torch.int32)
    ]
    cases += [
        torch.randn(300, 256),
        _nan_and_zeros(100),
        torch.randint(-9, 9, (50, 64), dtype=torch.int32),
    ]
    _same_bits_at_every_level(cases)


def test_rows_over_tiles_and_strided_rows() -> None:
    x = _shared_windows(256, torch.float32, seed=9).repeat(700, 1)
    _check(x)
    with kernels.tiles(3):
        _check(x[:, ::2], descending=True)  # strided rows of 128
        _check(x[:5, :200].t().contiguous(), dim=0)


def _wide_shared_windows(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Three rows of n 64-bit keys spanning far more than a window: a cluster of up to 200 keys
    that differ in their low bits only, neighbours of other keys, the dtype's extremes; float64
    rows also hold values that round to the same float32 (the cluster, the neighbours), values
    that round to 0.0 or infinity as float32, NaN of both signs, infinities and -0.0; shuffled."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(3):
        big = min(200, n // 2)
        if dtype == torch.int64:
            start = int(torch.randint(-(2**60), 2**60, (1,), generator=g))
            cluster = start + torch.randint(0, 4096, (big,), generator=g)
            other = torch.randint(-(2**63), 2**63 - 8, (n - big - 2,), generator=g)
            other[1::3] = other[::3][: other[1::3].numel()] + 1  # neighbours of other keys
            ends = torch.tensor([-(2**63), 2**63 - 1])
        else:
            ulps = torch.randint(0, 4096, (big,), generator=g)
            cluster = (torch.tensor(1.5, dtype=torch.float64).view(torch.int64) + ulps).view(
                torch.float64
            )
            cluster[: big // 2] = -cluster[: big // 2]
            other = torch.randn(n - big - 2, generator=g, dtype=torch.float64) * 1000
            after = torch.nextafter(other, torch.tensor(float("inf"), dtype=torch.float64))
            other[1::3] = after[::3][: other[1::3].numel()]  # neighbours of other values
            specials = [1e-300, -1e-300, 3e-310, 1e300, -1e300, float("nan"), -float("nan")]
            specials += [float("inf"), float("-inf"), -0.0, 0.0]
            places = torch.randperm(other.numel(), generator=g)[: len(specials)]
            other[places] = torch.tensor(specials[: places.numel()], dtype=torch.float64)
            ends = torch.tensor([-1.7e308, 1.7e308], dtype=torch.float64)
        row = torch.cat([cluster, other, ends]).to(dtype)
        rows.append(row[torch.randperm(n, generator=g)])
    return torch.stack(rows)


@pytest.mark.parametrize("level", LEVELS)
def test_64_bit_spans_below_and_above_a_window(level: str) -> None:
    # Small integers of either sign (the window is the whole key), a span of exactly 2^22 keys
    # (the window of rows of 1024), the full int64 range, and float64 values that are float32
    # values (the window of the rounded value is exact) with their neighbours below.
    g = torch.Generator().manual_seed(7)
    with kernels.simd(level):
        for n in WIDE_LENGTHS:
            _check(torch.randint(-50, 50, (4, n), generator=g))
            spans = torch.randint(0, 2**22, (2, n), generator=g) + 2**40
            spans[:, :2] = torch.tensor([2**40, 2**40 + 2**22 - 1])
            _check(spans, descending=True)
            ends = torch.randint(-(2**63), 2**63 - 1, (2, n), generator=g)
            ends[:, 0] = -(2**63)
            ends[:, -1] = 2**63 - 1
            _check(ends)
            exact = torch.randn(2, n, generator=g).double()
            below = torch.nextafter(exact, torch.tensor(float("-inf"), dtype=torch.float64))
            _check(torch.where(torch.rand(2, n, generator=g) < 0.5, exact, below))
            # float32 values of a span narrower than the window, and their neighbours above
            # (which round to them): the windows drop no bit, yet neighbours share one
            narrow = 1 + torch.randint(0, 2**16, (2, n), generator=g).double() * 2.0**-23
            above = torch.nextafter(narrow, torch.tensor(float("inf"), dtype=torch.float64))
            _check(torch.where(torch.rand(2, n, generator=g) < 0.5, narrow, above))


def test_64_bit_keys_give_the_same_bits_at_every_level() -> None:
    cases = [
        _wide_shared_windows(n, dtype, seed=n + 2)
        for n in WIDE_LENGTHS
        for dtype in (torch.int64, torch.float64)
    ]
    cases += [torch.randn(300, 1024, dtype=torch.float64), torch.randint(-9, 9, (50, 64))]
    _same_bits_at_every_level(cases)
