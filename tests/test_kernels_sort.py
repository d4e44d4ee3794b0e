"""The tile-engine sort, argsort and topk against torch.sort / torch.topk, plus the engine view."""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest
import torch

from poptorch_sim import kernels

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.int16,
    torch.int8,
    torch.uint8,
]
SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, -float("nan")]


def _sample(shape: tuple[int, ...], dtype: torch.dtype, duplicates: bool = False) -> torch.Tensor:
    if dtype.is_floating_point:
        x = torch.randn(shape, dtype=torch.float64) * 100
        if duplicates:
            x = x.round() / 8
        x = x.to(dtype)
        flat = x.view(-1)
        if flat.numel() >= 12:
            positions = torch.randperm(flat.numel())[: len(SPECIALS) * 2]
            flat[positions] = torch.tensor(SPECIALS * 2, dtype=dtype)
        return x
    info = torch.iinfo(dtype)
    high = 5 if duplicates else info.max
    return torch.randint(info.min if not duplicates else 0, high, shape, dtype=dtype)


def _check_against_stable_sort(x: torch.Tensor, dim: int, descending: bool) -> None:
    values, indices = kernels.sort(x, dim=dim, descending=descending)
    ref_values, ref_indices = torch.sort(x, dim=dim, descending=descending, stable=True)
    torch.testing.assert_close(values, ref_values, equal_nan=True, rtol=0, atol=0)
    # Stable: identical indices, hence bit-identical values (-0.0 stays where it was).
    torch.testing.assert_close(indices, ref_indices, rtol=0, atol=0)
    # Bit-exact: values are the input's elements (NaN payloads, -0.0), compared as integers
    # because torch's own bfloat16 gather rewrites NaN bits.
    gathered = _bits(x).gather(dim, indices) if x.dim() else _bits(x)
    assert torch.equal(gathered, _bits(values))


def _bits(t: torch.Tensor) -> torch.Tensor:
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(as_int[t.element_size()])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
@pytest.mark.parametrize("length", [0, 1, 2, 7, 64, 1000, 40_000], ids=lambda n: f"n{n}")
def test_sort_matches_stable_torch_sort(dtype: torch.dtype, descending: bool, length: int) -> None:
    _check_against_stable_sort(_sample((length,), dtype), -1, descending)


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.uint8],
    ids=str,
)
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
@pytest.mark.parametrize("duplicates", [False, True], ids=["distinct", "duplicates"])
def test_long_row_scatter_sort_matches_stable_torch_sort(
    dtype: torch.dtype, descending: bool, duplicates: bool
) -> None:
    # Rows of >= 2^16 elements over several tiles take the scatter sort (NaN and -0.0 included).
    x = _sample((150_000,), dtype, duplicates=duplicates)
    with kernels.tiles(4):
        _check_against_stable_sort(x, -1, descending)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.full((100_000,), 2.5),
        lambda: torch.rand(100_000),
        lambda: torch.randint(0, 1 << 30, (100_000,), dtype=torch.int32),
        lambda: torch.cat([torch.zeros(99_999), torch.tensor([-0.0])]),
    ],
    ids=["all-equal", "positive-floats", "uniform-ints", "zeros-and-negative-zero"],
)
def test_long_row_scatter_sort_key_layouts(make) -> None:
    x = make()
    with kernels.tiles(2):
        _check_against_stable_sort(x, -1, False)
        argsort = kernels.argsort(x, descending=True)
    torch.testing.assert_close(argsort, torch.argsort(x, descending=True, stable=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "descending"])
def test_sort_duplicates_keep_input_order(dtype: torch.dtype, descending: bool) -> None:
    _check_against_stable_sort(_sample((3, 5000), dtype, duplicates=True), -1, descending)


@pytest.mark.parametrize(
    "shape,dim",
    [((4, 300), 0), ((5, 6, 7), 1), ((2, 3, 4), -3)],
    ids=["dim0", "middle", "negative"],
)
def test_sort_any_dim(shape: tuple[int, ...], dim: int) -> None:
    _check_against_stable_sort(_sample(shape, torch.float32), dim, False)


def test_sort_non_contiguous_and_batched_rows() -> None:
    x = _sample((64, 200), torch.float32).t()[::2]
    assert not x.is_contiguous()
    _check_against_stable_sort(x, -1, True)
    _check_against_stable_sort(x, 0, False)


def test_sort_nan_last_ascending_first_descending() -> None:
    x = torch.tensor([1.0, float("nan"), -float("inf"), -0.0, 0.0, float("inf"), -float("nan")])
    ascending = kernels.sort(x).values
    assert torch.isnan(ascending[-2:]).all() and ascending[0] == -float("inf")
    descending = kernels.sort(x, descending=True).values
    assert torch.isnan(descending[:2]).all() and descending[-1] == -float("inf")
    zeros = kernels.sort(x).values[1:3]
    assert torch.equal(torch.signbit(zeros), torch.tensor([True, False]))  # -0.0 came first


def test_sort_scalar_and_spread_over_many_tiles() -> None:
    values, indices = kernels.sort(torch.tensor(3.0))
    assert values.item() == 3.0 and indices.item() == 0
    x = _sample((100_000,), torch.float32)
    with kernels.tiles(1472):
        _check_against_stable_sort(x, -1, False)


def test_argsort_matches_stable_torch_argsort() -> None:
    x = _sample((7, 333), torch.float16, duplicates=True)
    expected = torch.argsort(x, dim=1, descending=True, stable=True)
    torch.testing.assert_close(kernels.argsort(x, dim=1, descending=True), expected)


def test_sort_values_gradient_scatters_back() -> None:
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    ours = kernels.sort(x, dim=1, descending=True).values
    ref = torch.sort(x, dim=1, descending=True).values
    weights = torch.randn_like(ours)
    (grad,) = torch.autograd.grad((ours * weights).sum(), x)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), x)
    torch.testing.assert_close(grad, ref_grad)


def _check_topk(x: torch.Tensor, k: int, dim: int, largest: bool) -> None:
    values, indices = kernels.topk(x, k, dim=dim, largest=largest)
    ref_values, _ = torch.topk(x, k, dim=dim, largest=largest, sorted=True)
    torch.testing.assert_close(values, ref_values, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(x.gather(dim, indices), values, equal_nan=True, rtol=0, atol=0)
    if x.numel():
        assert (indices.sort(dim=dim).values.diff(dim=dim) != 0).all()  # distinct positions


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize(
    "length,k", [(1, 1), (10, 0), (10, 10), (5000, 7), (70_000, 1000)], ids=lambda v: str(v)
)
def test_topk_matches_torch_topk(dtype: torch.dtype, largest: bool, length: int, k: int) -> None:
    _check_topk(_sample((length,), dtype), k, -1, largest)


def test_topk_batched_rows_other_dims_and_ties() -> None:
    _check_topk(_sample((6, 2000), torch.float32, duplicates=True), 50, 1, True)
    _check_topk(_sample((300, 5), torch.int32, duplicates=True), 3, 0, False)
    x = torch.zeros(1000)
    assert torch.equal(kernels.topk(x, 4).indices, torch.arange(4))  # lowest index wins


def test_topk_many_tiles_bitonic_merge() -> None:
    x = _sample((300_000,), torch.float32)  # >= 4096 elements per tile keeps all 64 tiles
    with kernels.tiles(64):
        kernels.reset_counters()
        _check_topk(x, 300, -1, True)
        stats = kernels.counters()["topk"]
    assert stats.supersteps == 1 + 6  # per-tile selection, then log2(64) merge rounds
    assert stats.bytes_exchanged == 63 * 512 * 8  # 63 merges of 512 padded items


def test_topk_values_gradient_scatters_back() -> None:
    x = torch.randn(3, 50, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(kernels.topk(x, 5, dim=1).values.sum(), x)
    (ref,) = torch.autograd.grad(torch.topk(x, 5, dim=1).values.sum(), x)
    torch.testing.assert_close(grad, ref)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: kernels.topk(torch.randn(5), 6), RuntimeError, r"k out of range: k=6"),
        (lambda: kernels.topk(torch.randn(5), -1), RuntimeError, r"k out of range: k=-1"),
        (lambda: kernels.sort(torch.randn(5), dim=2), IndexError, r"Dimension out of range"),
        (lambda: kernels.sort(torch.ones(3, dtype=torch.bool)), RuntimeError, "unsupported"),
        (lambda: kernels.sort(torch.ones(3, dtype=torch.complex64)), RuntimeError, "Bool|dtype"),
        (lambda: kernels.set_num_tiles(-2), ValueError, r"non-negative int.*-2"),
    ],
    ids=["k-too-big", "k-negative", "bad-dim", "bool", "complex", "negative-tiles"],
)
def test_bad_input_raises_clear_errors(call, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_engine_counts_supersteps_and_exchange() -> None:
    kernels.reset_counters()
    with kernels.tiles(4):
        kernels.sort(torch.randn(100_000))  # scatter sort: build, count, scatter, sort, write
        kernels.sort(torch.randn(40_000))  # mid row: local sorts, log2(4) merges, write-out
        kernels.sort(torch.randn(1000))  # short row: the bitonic network on one tile
    stats = kernels.counters()["sort"]
    assert stats.calls == 3
    assert stats.supersteps == 5 + (1 + 2 + 1) + 1
    assert stats.bytes_exchanged == 100_000 * 8 + 2 * 40_000 * 8
    assert stats.compare_exchanges > 100_000
    kernels.reset_counters()
    assert "sort" not in kernels.counters()


def test_skewed_keys_fall_back_to_merging() -> None:
    # Most keys share the top digit under a few far outliers: one group would hold them all.
    x = torch.cat([1.0 + torch.arange(200_000) * 1e-7, torch.tensor([1e30, -1e30])])
    kernels.reset_counters()
    with kernels.tiles(4):
        _check_against_stable_sort(x, -1, True)
    assert kernels.counters()["sort"].supersteps == 2 + 1 + 2 + 1  # declined, sort, merge, write


def test_tiles_context_restores_setting() -> None:
    before = kernels.num_tiles()
    with kernels.tiles(7):
        assert kernels.num_tiles() == 7
    assert kernels.num_tiles() == before


@pytest.mark.parametrize(
    "op,args",
    [
        (torch.ops.poptorch_sim.sort.default, (torch.randn(3, 40), 1, True)),
        (torch.ops.poptorch_sim.sort.default, (torch.randn(40, 3), 0, False)),
        (torch.ops.poptorch_sim.argsort.default, (torch.randn(5, 6), -1, False)),
        (torch.ops.poptorch_sim.topk.default, (torch.randn(4, 50), 5, -1, True, True)),
        (torch.ops.poptorch_sim.topk.default, (torch.randn(50, 4), 3, 0, False, True)),
    ],
    ids=["sort", "sort-dim0", "argsort", "topk", "topk-dim0-smallest"],
)
def test_opcheck(op, args: tuple) -> None:
    torch.library.opcheck(op, args)


def test_opcheck_with_gradients() -> None:
    x = torch.randn(3, 20, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.poptorch_sim.sort.default, (x, -1, False))
    torch.library.opcheck(torch.ops.poptorch_sim.topk.default, (x, 4, -1, True, True))


def test_concurrent_callers_and_more_threads_than_cores() -> None:
    # Simulated IPUs call kernels from several worker threads at once.
    rows = [torch.randn(200_000) for _ in range(4)]
    expected = [torch.sort(row, stable=True).indices for row in rows]
    results: list[torch.Tensor | None] = [None] * len(rows)
    previous = torch.get_num_threads()
    torch.set_num_threads(4)
    try:

        def work(i: int) -> None:
            results[i] = kernels.sort(rows[i]).indices

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(rows))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        torch.set_num_threads(previous)
    for got, want in zip(results, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_large_outputs_reuse_freed_blocks_and_never_share_live_ones() -> None:
    # See [Note: output cache]: 2^19 float32 values (2 MiB) and their int64 indices come from it.
    x, y = torch.randn(1 << 19), torch.randn(1 << 19)
    first = kernels.sort(x)
    freed = first.values.data_ptr()
    del first
    kept = kernels.sort(y)
    assert kept.values.data_ptr() == freed  # the freed block, already faulted in
    expected = kept.values.clone()
    other = kernels.sort(x)
    assert other.values.data_ptr() != kept.values.data_ptr()
    assert torch.equal(kept.values, expected)
    assert torch.equal(other.values, torch.sort(x).values)
    # Storages stay resizable, keeping their contents.
    kept.values.resize_(1 << 20)
    assert torch.equal(kept.values[: 1 << 19], expected)


def _sort_in_child(queue: multiprocessing.Queue) -> None:
    # numpy builds the data: torch's own OpenMP ops are not fork-safe after the parent used them.
    # 200,000 int64 values (1.6 MB) take the output cache's path, which a child bypasses.
    x = torch.from_numpy(np.arange(200_000, 0, -1))
    values = kernels.sort(x).values.numpy()
    queue.put(bool(np.array_equal(values, np.arange(1, 200_001))))


def test_sort_works_in_a_forked_child() -> None:
    # DataLoader workers fork after the tile pool has started; the child must not deadlock.
    kernels.sort(torch.randn(200_000))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_sort_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) is True
