"""Short rows and the in-cache base case of the sort (the bitonic network) against torch.sort."""

from __future__ import annotations

import pytest
import torch
from test_kernels_sort import DTYPES  # every dtype the sort takes

from poptorch_sim import kernels
from poptorch_sim.kernels import engine, simd_choice

# Around every power of two the network pads to, up to the longest rows it takes (kBitonicRowMax
# in csrc/sort/sort.cpp: 2^15).
LENGTHS = [1, 2, 3, 5, 8, 15, 16, 17, 31, 33, 64, 100, 255, 256, 257, 1000, 1024, 4095, 4096]
LENGTHS += [4097, 20_000, 32768]
SPECIALS = [float("nan"), -float("nan"), float("inf"), float("-inf"), -0.0, 0.0]
LEVELS = engine.SIMD_LEVELS[: engine.SIMD_LEVELS.index(kernels.supported_simd_level()) + 1]
# The 8-lane network compiled for AVX2: a test hook setup.py builds where the CPU lacks AVX-512.
EIGHT_LANES_BUILT = torch.ops.poptorch_sim._sort_rows_8_lanes_built()
needs_8_lanes = pytest.mark.skipif(
    "avx2" not in LEVELS or not EIGHT_LANES_BUILT,
    reason="the 8-lane network runs on AVX2 and is built where the building CPU lacks AVX-512 "
    "(here its AVX-512 variant is tested itself; see [Note: the 8-lane hook] in setup.py)",
)


def _rows(rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows with duplicates in every row and, for floats, NaN of both signs, +-inf and +-0.0."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(rows, n, generator=g, dtype=torch.float64) * 100
        x[:, ::2] = torch.randint(-8, 8, (rows, (n + 1) // 2), generator=g) / 4  # duplicates
        x = x.to(dtype)
        # in each row, the specials at places of their own drawn at random
        k = min(n, len(SPECIALS))
        places = torch.rand(rows, n, generator=g).argsort(dim=1)[:, :k]
        return x.scatter_(1, places, torch.tensor(SPECIALS[:k], dtype=dtype).expand(rows, k))
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (rows, n), generator=g, dtype=torch.int64)
    x[:, ::2] = torch.randint(-3, 3, (rows, (n + 1) // 2), generator=g)  # duplicates
    return x.clamp(info.min, info.max).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(as_int[t.element_size()])


def _check(x: torch.Tensor, dim: int = -1, descending: bool = False) -> None:
    values, indices = kernels.sort(x, dim=dim, descending=descending)
    ref_values, ref_indices = torch.sort(x, dim=dim, descending=descending, stable=True)
    # Stable: the same indices; values bit for bit the input's elements (NaN payloads, -0.0),
    # gathered as integers because torch's bfloat16 gather rewrites NaN bits.
    assert torch.equal(indices, ref_indices)
    assert torch.equal(_bits(values), _bits(x).gather(dim, ref_indices))
    torch.testing.assert_close(values, ref_values, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(kernels.argsort(x, dim=dim, descending=descending), ref_indices)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"n{n}")
def test_short_rows_match_stable_torch_sort(
    dtype: torch.dtype, descending: bool, length: int
) -> None:
    _check(_rows(5, length, dtype, seed=length), descending=descending)


@pytest.mark.parametrize("length", [16, 64, 256], ids=lambda n: f"n{n}")
def test_many_rows_spread_over_tiles_and_one_row_alone(length: int) -> None:
    _check(_rows(3001, length, torch.float32, seed=1))
    _check(_rows(1, length, torch.float32, seed=2), descending=True)
    with kernels.tiles(3):
        _check(_rows(7, length, torch.bfloat16, seed=3))


@pytest.mark.parametrize("length", [16, 1024, 1032, 4096], ids=lambda n: f"n{n}")
def test_batches_written_with_streaming_stores(length: int) -> None:
    # One tile writing at least 2^16 items of rows a multiple of 2W long (up to kRun, or from
    # kStreamRowMin) streams them out ([Note: streaming stores]); rows without NaN or -0.0
    # stream their values too.
    rows = (1 << 16) // length + 3
    g = torch.Generator().manual_seed(length)
    with kernels.tiles(1):
        _check(torch.randn(rows, length, generator=g))
        _check(torch.randn(rows, length, generator=g), descending=True)
        _check(_rows(rows, length, torch.float32, seed=11))  # NaN and -0.0: values gathered
        _check(_rows(rows, length, torch.int32, seed=12), descending=True)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("length", [32, 64, 200, 256, 1000], ids=lambda n: f"n{n}")
def test_rows_of_17_to_1023_in_either_store_mode(length: int, stream: bool) -> None:
    # One tile writing at least 2^16 items of such rows streams them out where the measured
    # choice says so ([Note: streaming stores]); the bits are the same either way.
    rows = (1 << 16) // length + 3
    simd_choice.ensure(simd_choice.STORES)  # (the first such sort would make the choice)
    previous = engine.set_stream_mid_rows(stream)
    try:
        with kernels.tiles(1):
            for seed, dtype in enumerate(DTYPES):
                _check(_rows(rows, length, dtype, seed=30 + seed), descending=seed % 2 == 1)
            _check(torch.randn(rows, length, dtype=torch.float64))  # no NaN, no -0.0
    finally:
        engine.set_stream_mid_rows(previous)


def test_non_contiguous_rows_and_other_dims() -> None:
    wide = _rows(40, 200, torch.float32, seed=4)
    _check(wide[:, ::2])  # strided rows of 100
    _check(wide[::3, 7:70])  # a window
    _check(wide.t(), dim=0)  # sorted along the strided dim
    cube = _rows(6, 30 * 17, torch.float16, seed=5).view(6, 30, 17)
    for dim in range(3):
        _check(cube, dim=dim, descending=dim == 1)
    _check(_rows(1, 50, torch.int16, seed=6).view(50), dim=0)  # one 1-D row


def _ordered_keys(n: int, period: int) -> list[torch.Tensor]:
    """Rows of n float64 keys: sorted, reversed, organ pipe, few keys, all equal, two values, a
    reversed sawtooth of ``period``."""
    up = torch.arange(n, dtype=torch.float64)
    patterns = [up, up.flip(0), torch.cat([up[: n // 2], up[: n // 2].flip(0)]), up % 3]
    return patterns + [torch.zeros(n), (up % 2) * 5, up.remainder(period).flip(0) - 7.5]


def _nan_and_zeros(n: int) -> torch.Tensor:
    """Two float32 rows of n: 0.0, with -0.0 every third item and NaN every seventh from 1."""
    x = torch.zeros(2, n)
    x[:, ::3] = -0.0
    x[:, 1::7] = float("nan")
    return x


def _same_bits_at_every_level(cases: list[torch.Tensor]) -> None:
    """Each case sorted (descending, one tile) at every SIMD level gives the same bits."""
    results = []
    for level in LEVELS:
        with kernels.simd(level), kernels.tiles(1):
            results.append([kernels.sort(x, descending=True) for x in cases])
    for other in results[1:]:
        for (got_values, got_indices), (values, indices) in zip(other, results[0], strict=True):
            assert torch.equal(got_indices, indices)
            assert torch.equal(_bits(got_values), _bits(values))


def _wide_rows(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """64-bit rows whose keys span more than 2^32 and many of which differ in their low bits only:
    the network sorts them by a window of 32 bits, runs of equal windows are sorted after it (see
    [Note: wide keys] in csrc/sort/bitonic/row_loops.inc)."""
    g = torch.Generator().manual_seed(seed)
    rows, n = 6, 3000
    if dtype == torch.int64:
        high = torch.randint(-2, 2, (rows, n), generator=g) << 40
        return high + torch.randint(0, 1 << 12, (rows, n), generator=g)
    # float64 values that differ in their lowest mantissa bits only, and their negatives
    low = torch.randint(0, 1 << 12, (rows, n), generator=g, dtype=torch.float64) * 2.0**-45
    sign = torch.randint(0, 2, (rows, n), generator=g, dtype=torch.float64) * 2 - 1
    x = sign * (1.0 + low)
    x[:, :8] = torch.tensor(SPECIALS + [1.0, -1.0], dtype=torch.float64)
    return x


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=str)
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
def test_wide_keys_that_differ_below_their_top_32_bits(
    dtype: torch.dtype, descending: bool
) -> None:
    x = _wide_rows(dtype, seed=12)
    _check(x, descending=descending)
    _check(x[:, :16], descending=descending)  # rows of one column block
    _check(x.remainder(1 << 20) if dtype == torch.int64 else x.abs(), descending=descending)
    small = torch.randint(-30_000, 30_000, (5, 999), generator=torch.Generator().manual_seed(3))
    _check(small.to(dtype), descending=descending)  # a span below 2^32 around zero: exact


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=str)
@pytest.mark.parametrize("level", LEVELS)
def test_streamed_wide_keys_match_stable_torch_sort(dtype: torch.dtype, level: str) -> None:
    # One tile writes >= 2^16 items: rows of 16 and of 1024 go out with streaming stores, and
    # their runs of equal windows (keys that differ below their top 32 bits) are found W pairs
    # at a time.
    g = torch.Generator().manual_seed(21)
    with kernels.simd(level), kernels.tiles(1):
        for rows, n in ((4099, 16), (65, 1024)):
            x = _wide_rows(dtype, seed=n)[:1].expand(rows, 3000)[:, :n].clone()
            x = x[:, torch.randperm(n, generator=g)]
            _check(x)
            _check(x, descending=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=str)
@pytest.mark.parametrize("level", LEVELS)
def test_one_run_of_equal_windows_anywhere_in_the_row(dtype: torch.dtype, level: str) -> None:
    # Keys spread over more than 2^32, all in windows of their own but for one pair, which
    # differs in its low bits only and is given in reverse order: smallest, in the middle or
    # largest, in rows of every length the tie scan's chunks (4W pairs) cover differently.
    g = torch.Generator().manual_seed(23)
    for n in (3, 9, 17, 31, 33, 40, 64, 65, 70, 100, 129):
        for rank in sorted({0, n // 2, n - 2}):
            keys = torch.arange(n, dtype=torch.int64) - n // 2
            keys[rank + 1] = keys[rank]
            if dtype == torch.int64:
                x = (keys << 40) + (torch.arange(n) == rank)  # the pair: low bits 1 then 0
            else:
                x = torch.ldexp(1.0 + keys.double() / n, keys.double().clamp(-10, 10).long())
                x[rank] = torch.nextafter(x[rank], torch.tensor(float("inf"), dtype=x.dtype))
            x = x[torch.randperm(n, generator=g)].repeat(3, 1)
            with kernels.simd(level), kernels.tiles(1):
                _check(x)
                _check(x, descending=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int16], ids=str)
@pytest.mark.parametrize("level", LEVELS)
def test_16_bit_keys_without_nan_match_stable_torch_sort(dtype: torch.dtype, level: str) -> None:
    # Rows with no NaN or -0.0 have their values made from the sorted keys rather than read from
    # the input (see [Note: 16-bit keys] in csrc/sort/bitonic/narrow_rows.inc): every length the
    # 32-bit items pad or finish differently, and rows streamed out by one tile.
    g = torch.Generator().manual_seed(22)
    with kernels.simd(level), kernels.tiles(1):
        for rows, n in ((3, 17), (3, 31), (3, 33), (3, 100), (2, 1000), (2, 4097), (65, 1024)):
            if dtype.is_floating_point:
                x = (torch.randn(rows, n, generator=g) * 3).round(decimals=1).to(dtype)
                x[x == 0] = 0.5  # no -0.0
            else:
                x = torch.randint(-40, 40, (rows, n), generator=g).to(dtype)
                x[:, :2] = torch.tensor([-32768, 32767], dtype=dtype)
            _check(x)
            _check(x, descending=True)


def test_all_equal_and_already_sorted_rows() -> None:
    _check(torch.zeros(9, 33))
    _check(torch.full((4, 64), float("nan")))
    _check(torch.arange(256.0).repeat(3, 1), descending=True)
    _check(torch.arange(256, 0, -1, dtype=torch.int32).repeat(3, 1))
    _check(torch.zeros(5, 100, dtype=torch.float64))
    _check(torch.arange(1000, 0, -1, dtype=torch.int64).repeat(3, 1) << 40)


# Dtypes of each item layout: 32-bit keys, 16-bit keys, 64-bit keys.
LONG_ROW_DTYPES = [torch.float32, torch.int16, torch.float64]


@pytest.mark.parametrize("n", [8192, 32768], ids=lambda n: f"n{n}")
def test_long_rows_of_ordered_and_repeated_keys(n: int) -> None:
    # Sorted, reversed, organ pipe, sawtooth, all equal, two values, all NaN: every variant
    # against torch.sort.
    up = torch.arange(n, dtype=torch.float32)
    patterns = [up, up.flip(0), torch.cat([up[: n // 2], up[: n // 2].flip(0)]), up % 37]
    patterns += [torch.zeros(n), (up % 2) * 5, torch.full((n,), float("nan"))]
    for level in LEVELS:
        with kernels.simd(level):
            for x in patterns:
                _check(x.repeat(2, 1))
                if not x.isnan().any():
                    _check(x.to(torch.int64).repeat(2, 1), descending=True)


@pytest.mark.parametrize(
    "level",
    [
        pytest.param(
            level,
            marks=pytest.mark.skipif(
                level not in LEVELS[:-1], reason=f"{level} is not narrower than {LEVELS[-1]} here"
            ),
        )
        for level in engine.SIMD_LEVELS[:-1]
    ],
)
def test_narrower_variants_give_the_same_bits(level: str) -> None:
    # Short rows of every length the network pads differently, and one long row whose
    # scatter-sort groups (about 32 items each) take the network as their base case.
    cases = [_rows(33, n, dtype, seed=n) for n in (3, 16, 17, 100, 256) for dtype in DTYPES]
    cases += [_wide_rows(dtype, seed=13) for dtype in (torch.int64, torch.float64)]
    long_row = _rows(1, 1 << 17, torch.float32, seed=7).view(-1)
    cases += [long_row, long_row.to(torch.int32)]
    cases += [torch.randn(4099, 16), torch.randn(65, 1024)]  # streamed out by one tile
    # long rows of each item layout: 32-bit, 16-bit and 64-bit keys
    cases += [_rows(2, n, dtype, seed=n) for n in (8192, 20_000) for dtype in LONG_ROW_DTYPES]
    with kernels.simd(LEVELS[-1]), kernels.tiles(1):
        widest = [kernels.sort(x, descending=True) for x in cases]
    with kernels.simd(level), kernels.tiles(1):
        narrower = [kernels.sort(x, descending=True) for x in cases]
    for (got_values, got_indices), (values, indices) in zip(narrower, widest, strict=True):
        assert torch.equal(got_indices, indices)
        assert torch.equal(_bits(got_values), _bits(values))


def test_long_rows_with_network_base_case_match_torch_sort() -> None:
    # 2^17 random keys: the scatter sort's groups hold ~32 items, sorted by the network.
    _check(_rows(1, 1 << 17, torch.float32, seed=8).view(-1))
    _check(_rows(1, 1 << 17, torch.int8, seed=9).view(-1), descending=True)
    _check(_rows(2, 40_000, torch.float16, seed=10))  # per-tile slices and merges


def _check_8_lanes(x: torch.Tensor, descending: bool = False) -> None:
    values, indices = torch.ops.poptorch_sim._sort_rows_8_lanes(x, descending)
    ref_values, ref_indices = torch.sort(x, descending=descending, stable=True)
    assert torch.equal(indices, ref_indices)
    assert torch.equal(_bits(values), _bits(x).gather(-1, ref_indices))


@needs_8_lanes
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_8_lane_network_matches_stable_torch_sort(dtype: torch.dtype) -> None:
    # The AVX-512 variant's logic (8 lanes), compiled for AVX2 so that it runs without AVX-512:
    # every length it pads or dispatches differently (P = 8, 16, the long rows from 17).
    for n in [*range(1, 70), *LENGTHS]:
        _check_8_lanes(_rows(3, n, dtype, seed=n), descending=n % 2 == 1)
    with kernels.tiles(1):  # one tile writes >= 2^16 items: streamed out (n = 16 and 1024)
        for n in (16, 1024):
            _check_8_lanes(torch.randn((1 << 16) // n + 3, n).to(dtype))
    if dtype in (torch.int64, torch.float64):
        _check_8_lanes(_wide_rows(dtype, seed=14), descending=True)


@needs_8_lanes
def test_8_lane_network_names_what_it_cannot_sort() -> None:
    with pytest.raises(RuntimeError, match="unsupported dtype Bool"):
        torch.ops.poptorch_sim._sort_rows_8_lanes(torch.ones(5, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="rows of at most 32768 items, got 32769"):
        torch.ops.poptorch_sim._sort_rows_8_lanes(torch.randn(32769))


@pytest.mark.skipif(EIGHT_LANES_BUILT, reason="this library has the 8-lane network")
def test_8_lane_network_left_out_says_how_to_build_it() -> None:
    with pytest.raises(RuntimeError, match="built without the 8-lane network .*BUILD_8_LANES=1"):
        torch.ops.poptorch_sim._sort_rows_8_lanes(torch.randn(4, 16))
