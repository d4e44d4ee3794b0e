"""poptorch.DataLoader and AsynchronousDataAccessor against plain torch DataLoaders."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_data import (
    CountingDataset,
    CountingIterable,
    DictDataset,
    FailingDataset,
    SecondEpochFails,
)

from poptorch_sim.data import AsynchronousDataAccessor, DataLoader, workers
from poptorch_sim.data.process_block import process_block
from poptorch_sim.data.rebatch import combine_batches, rebatch
from poptorch_sim.enums import CommGroupType, DataLoaderMode, SharingStrategy
from poptorch_sim.errors import Error
from poptorch_sim.options import Options

Sync, Async, AsyncRebatched = (
    DataLoaderMode.Sync,
    DataLoaderMode.Async,
    DataLoaderMode.AsyncRebatched,
)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def make_options(di: int = 1, ga: int = 1, r: int = 1, g: int = 1, **distributed: int) -> Options:
    opts = Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if g != 1:
        opts.inputReplicaGrouping(g, CommGroupType.Consecutive)
    if distributed:
        opts.Distributed.configureProcessId(distributed["process_id"], distributed["processes"])
    return opts


def tensor_dataset(n: int) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.arange(n * 2.0).reshape(n, 2), torch.arange(n))


def collect(loader: Any, epochs: int = 1) -> list[list[Any]]:
    """Every batch of ``epochs`` epochs, as nested lists."""

    def plain(batch: Any) -> Any:
        if isinstance(batch, dict):
            return {k: v.tolist() for k, v in batch.items()}
        if isinstance(batch, (list, tuple)):
            return [t.tolist() for t in batch]
        return batch.tolist()

    return [[plain(b) for b in loader] for _ in range(epochs)]


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a thread of its own; fail the test (instead of hanging) if it takes too long."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as error:  # noqa: BLE001
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"did not finish within {seconds} s (hang)"
    if "error" in result:
        raise result["error"]
    return result.get("value")


class Leaks:
    """Threads and child processes started since construction and still running."""

    def __init__(self) -> None:
        self.threads = set(threading.enumerate())
        self.children = set(multiprocessing.active_children())

    def now(self) -> tuple[list[str], list[str]]:
        threads = [t.name for t in threading.enumerate() if t not in self.threads]
        children = [p.name for p in multiprocessing.active_children() if p not in self.children]
        return threads, children

    def settled(self, timeout: float = 5.0) -> tuple[list[str], list[str]]:
        """``now()`` once nothing new is running, or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.now() != ([], []) and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.now()


# ---- combined batch size -------------------------------------------------------------------
@pytest.mark.parametrize(
    "bs,di,ga,r,g,combined",
    [
        (1, 1, 1, 1, 1, 1),
        (2, 3, 1, 1, 1, 6),
        (2, 1, 4, 1, 1, 8),
        (2, 1, 1, 4, 1, 8),
        (2, 1, 1, 4, 2, 4),
        (2, 1, 1, 4, 4, 2),
        (3, 2, 2, 2, 1, 24),
        (40, 10, 10, 1, 1, 4000),
    ],
    ids=["1", "di3", "ga4", "r4", "r4-g2", "r4-g4", "all2", "mnist-tutorial"],
)
def test_combined_batch_size(bs: int, di: int, ga: int, r: int, g: int, combined: int) -> None:
    n = 2 * combined + combined - 1  # two full combined batches and an incomplete one
    loader = DataLoader(make_options(di, ga, r, g), tensor_dataset(n), batch_size=bs)
    assert loader.combinedBatchSize == combined
    assert len(loader) == 2
    assert [b[1].shape[0] for b in loader] == [combined, combined]


@pytest.mark.parametrize("num_workers", [0, 2], ids=["in-process", "2-workers"])
@pytest.mark.parametrize("dataset", ["tuple", "dict"])
def test_batches_equal_torch_dataloader(num_workers: int, dataset: str) -> None:
    data = tensor_dataset(50) if dataset == "tuple" else DictDataset(50)
    loader = DataLoader(make_options(di=2, ga=3), data, batch_size=2, num_workers=num_workers)
    reference = torch.utils.data.DataLoader(data, batch_size=12, drop_last=True)
    assert collect(loader) == collect(reference)
    assert len(loader) == len(reference) == 4


def test_defaults_shuffle_false_persistent_workers_and_options() -> None:
    opts = make_options(di=2)
    loader = DataLoader(opts, tensor_dataset(8), batch_size=2)
    assert collect(loader)[0][0][1] == [0, 1, 2, 3]
    assert loader.options is opts
    assert loader.persistent_workers is False
    assert DataLoader(make_options(), tensor_dataset(8), num_workers=1).persistent_workers
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(3)


def test_shuffle_is_a_permutation_of_the_dataset() -> None:
    loader = DataLoader(make_options(di=2), tensor_dataset(12), batch_size=3, shuffle=True)
    labels = sorted(x for batch in collect(loader)[0] for x in batch[1])
    assert labels == list(range(12))


def test_options_must_be_options() -> None:
    with pytest.raises(AssertionError, match="expects a poptorch.Options"):
        DataLoader({"device_iterations": 1}, tensor_dataset(4))


def test_batch_size_none_does_not_batch() -> None:
    loader = DataLoader(make_options(di=4), tensor_dataset(3), batch_size=None)
    assert loader.combinedBatchSize is None
    assert collect(loader) == collect(
        torch.utils.data.DataLoader(tensor_dataset(3), batch_size=None)
    )


# ---- drop_last -----------------------------------------------------------------------------
def test_drop_last_default_drops_incomplete_batch(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(make_options(di=2), tensor_dataset(11), batch_size=2)
    assert len(loader) == 2
    assert [len(b[1]) for b in loader] == [4, 4]
    assert "not divisible" not in capsys.readouterr().err


def test_drop_last_false_warns_and_keeps_incomplete_batch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loader = DataLoader(make_options(di=2), tensor_dataset(11), batch_size=2, drop_last=False)
    err = capsys.readouterr().err
    assert (
        "The number of elements in the dataset (11) is not divisible by the number of elements "
        "processed per step (4) and drop_last=False. The last tensor will have a batch size of 3."
    ) in err
    assert len(loader) == 3
    assert [len(b[1]) for b in loader] == [4, 4, 3]


# ---- batch_sampler -------------------------------------------------------------------------
@pytest.mark.parametrize("drop_last", [True, False], ids=["drop_last", "keep_last"])
def test_batch_sampler_batches_are_combined(drop_last: bool) -> None:
    data = tensor_dataset(20)
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.SequentialSampler(data), batch_size=3, drop_last=False
    )
    loader = DataLoader(make_options(di=2), data, batch_sampler=sampler, drop_last=drop_last)
    assert loader.combinedBatchSize == 6
    expected = [list(range(i, min(i + 6, 20))) for i in range(0, 20, 6)]
    if drop_last:
        expected = expected[:-1]
    assert [b[1].tolist() for b in loader] == expected
    assert len(loader) == len(expected)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"batch_size": 2}, "mutually exclusive with batch_size, shuffle"),
        ({"shuffle": True}, "mutually exclusive with batch_size, shuffle"),
        ({"opts": {"process_id": 0, "processes": 2}}, "auto_distributed_partitioning=True"),
    ],
    ids=["batch_size", "shuffle", "distributed"],
)
def test_batch_sampler_errors(kwargs: dict[str, Any], message: str) -> None:
    opts = make_options(**kwargs.pop("opts", {}))
    sampler = torch.utils.data.BatchSampler(range(8), batch_size=2, drop_last=False)
    with pytest.raises(Error, match=message):
        DataLoader(opts, tensor_dataset(8), batch_sampler=sampler, **kwargs)


# ---- distributed partitioning --------------------------------------------------------------
def shard(process_id: int, processes: int, n: int, **kwargs: Any) -> list[int]:
    loader = DataLoader(
        make_options(process_id=process_id, processes=processes), tensor_dataset(n), **kwargs
    )
    return [x for batch in collect(loader)[0] for x in batch[1]]


@pytest.mark.parametrize(
    "n,batch_size,processes", [(20, 2, 2), (23, 2, 2), (50, 4, 3)], ids=["even", "odd", "3-proc"]
)
def test_distributed_shards_are_contiguous_disjoint_blocks(
    n: int, batch_size: int, processes: int
) -> None:
    per_proc = batch_size * (n // (batch_size * processes))
    shards = [shard(p, processes, n, batch_size=batch_size) for p in range(processes)]
    for p, got in enumerate(shards):
        assert got == list(range(p * per_proc, (p + 1) * per_proc))
    assert sorted(sum(shards, [])) == list(range(per_proc * processes))


def test_distributed_drop_last_false_covers_everything() -> None:
    shards = [shard(p, 3, 11, batch_size=2, drop_last=False) for p in range(3)]
    assert shards == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]


@pytest.mark.parametrize("num_workers", [0, 2], ids=["in-process", "2-workers"])
def test_distributed_shuffle_follows_the_global_permutation(num_workers: int) -> None:
    # 22 elements, combined batch 4, 2 processes: blocks of 8, 6 leftovers. Every epoch draws a
    # global permutation from the seed; the blocks alternate between starting at 6 and at 0
    # past each process's base, so the leftovers are read too.
    generator = torch.Generator().manual_seed(7)
    permutations = [torch.randperm(22, generator=generator).tolist() for _ in range(3)]
    for p in range(2):
        opts = make_options(process_id=p, processes=2).randomSeed(7)
        loader = DataLoader(
            opts, tensor_dataset(22), batch_size=4, shuffle=True, num_workers=num_workers
        )
        got = [[x for b in epoch for x in b[1]] for epoch in collect(loader, 3)]
        loader.terminate()
        for epoch, permutation in enumerate(permutations):
            start = p * 8 + (6 if epoch % 2 == 0 else 0)
            assert got[epoch] == permutation[start : start + 8], (p, epoch)


def test_distributed_shuffle_requires_random_seed() -> None:
    with pytest.raises(AssertionError, match=r"you must set poptorch.Options.randomSeed\(\)"):
        DataLoader(make_options(process_id=0, processes=2), tensor_dataset(8), shuffle=True)


def test_distributed_batch_size_none_is_rejected() -> None:
    with pytest.raises(AssertionError, match="batch_size=None not allowed"):
        DataLoader(make_options(process_id=0, processes=2), tensor_dataset(8), batch_size=None)


@pytest.mark.parametrize(
    "args,expected",
    [((100, 16, 3, 1, True), (32, 32, 4)), ((10, 2, 4, 3, True), (6, 2, 2))],
    ids=["pytorch-doc", "small"],
)
def test_process_block(args: tuple[Any, ...], expected: tuple[int, int, int]) -> None:
    assert process_block(*args) == expected


# ---- IterableDataset -----------------------------------------------------------------------
def test_iterable_dataset_batches_and_rules(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(make_options(di=2), CountingIterable(9), batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(TypeError, match="has no len()"):
        len(loader)
    DataLoader(make_options(), CountingIterable(4), num_workers=2)
    assert "will return 2 times each element" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="auto_distributed_partitioning not supported"):
        DataLoader(make_options(process_id=0, processes=2), CountingIterable(4))


# ---- asynchronous modes --------------------------------------------------------------------
@pytest.mark.parametrize("num_workers", [0, 2], ids=["in-process", "2-workers"])
@pytest.mark.parametrize(
    "mode,drop_last,worker_size",
    [
        (Async, True, None),
        (Async, False, None),
        (AsyncRebatched, True, None),
        (AsyncRebatched, True, 1),
        (AsyncRebatched, False, 3),
    ],
    ids=["async", "async-keep-last", "rebatched", "rebatched-w1", "rebatched-w3-keep-last"],
)
def test_async_equals_sync_over_two_epochs(
    mode: DataLoaderMode, drop_last: bool, worker_size: int | None, num_workers: int
) -> None:
    data, opts = tensor_dataset(23), make_options(di=2, ga=2)
    sync = DataLoader(opts, data, batch_size=2, drop_last=drop_last)
    loader = DataLoader(
        opts,
        data,
        batch_size=2,
        drop_last=drop_last,
        num_workers=num_workers,
        mode=mode,
        rebatched_worker_size=worker_size,
    )
    try:
        expected = collect(sync, 2)
        assert within(30, lambda: collect(loader, 2)) == expected
        assert len(loader) == len(expected[0]) == (2 if drop_last else 3)
    finally:
        loader.terminate()


def test_async_dict_batches_and_stopping_part_way() -> None:
    loader = DataLoader(make_options(di=2), DictDataset(10), batch_size=1, mode=Async)
    try:
        first = next(iter(loader))
        assert first["label"].tolist() == [0, 1]
        # A new epoch after stopping part-way starts again from the beginning.
        assert collect(loader) == collect(DataLoader(make_options(di=2), DictDataset(10)))
    finally:
        loader.terminate()


def test_stopping_part_way_abandons_the_rest_of_the_epoch(tmp_path: Path) -> None:
    data = CountingDataset(200, str(tmp_path / "loads"))  # counted in the worker process too
    loader = DataLoader(make_options(), data, mode=Async, async_options={"buffer_size": 2})
    try:
        iterator = iter(loader)
        next(iterator), next(iterator)
        assert within(30, lambda: len(collect(loader)[0])) == 200
        # The second epoch loaded every item; loading the rest of the abandoned first epoch too
        # would take 200 + 200 loads.
        assert 200 <= data.loads < 250
    finally:
        loader.terminate()


def test_rebatched_worker_size_must_not_exceed_combined() -> None:
    with pytest.raises(
        AssertionError,
        match=r"The rebatched_worker_size \(5\) must be <= to the combined batch size \(4\)",
    ):
        DataLoader(
            make_options(di=2),
            tensor_dataset(8),
            batch_size=2,
            mode=AsyncRebatched,
            rebatched_worker_size=5,
        )


def test_rebatched_size_in_async_options_is_rejected() -> None:
    with pytest.raises(AssertionError, match="manually specify the rebatched_size"):
        DataLoader(
            make_options(di=2), tensor_dataset(8), mode=Async, async_options={"rebatched_size": 2}
        )


@pytest.mark.parametrize("early_preload,expected", [(True, 3), (False, 1)], ids=["early", "lazy"])
def test_early_preload(early_preload: bool, expected: int) -> None:
    loader = DataLoader(
        make_options(),
        tensor_dataset(10),
        mode=Async,
        async_options={"early_preload": early_preload, "buffer_size": 3},
    )
    try:
        # The worker process's ring: one flag per slot, set while a loaded batch waits.
        flags = loader._accessor._worker._data_buffers.indices_mem  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        while int(flags.sum()) < expected and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert int(flags.sum()) == expected
        assert collect(loader) == collect(torch.utils.data.DataLoader(tensor_dataset(10)))
    finally:
        loader.terminate()


@pytest.mark.parametrize("load_indefinitely", [True, False], ids=["indefinitely", "on-demand"])
def test_accessor_over_dataset_and_loader(load_indefinitely: bool) -> None:
    data = tensor_dataset(7)
    accessor = AsynchronousDataAccessor(data, load_indefinitely=load_indefinitely, buffer_size=2)
    try:
        assert len(accessor) == 7
        assert collect(accessor, 2) == [[[[2.0 * i, 2.0 * i + 1], i] for i in range(7)]] * 2
    finally:
        accessor.terminate()
    sync = DataLoader(make_options(di=2), data)
    accessor = AsynchronousDataAccessor(sync, load_indefinitely=load_indefinitely)
    try:
        assert len(accessor) == 3
        assert collect(accessor, 2) == collect(sync, 2)
    finally:
        accessor.terminate()


def test_accessor_rebatches_a_loader() -> None:
    sync = DataLoader(make_options(), tensor_dataset(7), batch_size=2)
    accessor = AsynchronousDataAccessor(sync, rebatched_size=3)
    try:
        assert [b[1].tolist() for b in accessor] == [[0, 1, 2], [3, 4, 5]]
        assert len(accessor) == 2
    finally:
        accessor.terminate()


# ---- errors --------------------------------------------------------------------------------
def test_accessor_errors() -> None:
    async_loader = DataLoader(make_options(), tensor_dataset(4), mode=Async)
    with pytest.raises(Error, match="already uses an AsynchronousDataAccessor internally"):
        AsynchronousDataAccessor(async_loader)
    async_loader.terminate()
    keep_last = DataLoader(make_options(di=2), tensor_dataset(5), drop_last=False)
    with pytest.raises(AssertionError, match="'drop_last=False' option from the DataLoader"):
        AsynchronousDataAccessor(keep_last)
    with pytest.raises(AssertionError, match="rebatched_size must be None or greater than 1"):
        AsynchronousDataAccessor(tensor_dataset(4), rebatched_size=1)
    with pytest.raises(Error, match="The Dataset is empty"):
        AsynchronousDataAccessor(tensor_dataset(0))
    with pytest.raises(ValueError):
        AsynchronousDataAccessor(tensor_dataset(2), sharing_strategy=17)
    AsynchronousDataAccessor(tensor_dataset(2), sharing_strategy=SharingStrategy.Fork).terminate()


@pytest.mark.parametrize("num_workers", [0, 2], ids=["in-process", "2-workers"])
def test_dataset_failing_at_start(num_workers: int) -> None:
    loader = DataLoader(make_options(), FailingDataset(8, 0), num_workers=num_workers)
    with pytest.raises(Error, match=r"worker thread failed to start \(Check above") as info:
        within(30, lambda: AsynchronousDataAccessor(loader))
    assert isinstance(info.value.__cause__, ValueError)
    assert "cannot load item 0" in str(info.value.__cause__)


@pytest.mark.parametrize("load_indefinitely", [True, False], ids=["indefinitely", "on-demand"])
def test_failing_to_open_an_epoch_raises_in_that_epoch(load_indefinitely: bool) -> None:
    accessor = AsynchronousDataAccessor(SecondEpochFails(), load_indefinitely=load_indefinitely)
    try:
        assert within(30, lambda: collect(accessor)) == [[[0], [1]]]
        with pytest.raises(OSError, match="shard for epoch 2") as info:
            within(30, lambda: collect(accessor))
        assert any("AsynchronousDataAccessor" in note for note in info.value.__notes__)
        assert within(30, lambda: collect(accessor)) == [[[0], [1]]]
    finally:
        accessor.terminate()


def test_bad_data_structure_fails_to_start() -> None:
    with pytest.raises(Error, match="failed to start") as info:
        AsynchronousDataAccessor([(torch.zeros(1), "label")])
    assert isinstance(info.value.__cause__, AssertionError)
    assert "Tensor at index 1 is not a torch tensor (<class 'str'>)" in str(info.value.__cause__)


@pytest.mark.parametrize("num_workers", [0, 2], ids=["in-process", "2-workers"])
def test_dataset_failing_mid_epoch_raises_in_caller(num_workers: int) -> None:
    leaks = Leaks()
    loader = DataLoader(
        make_options(di=2), FailingDataset(20, 9), num_workers=num_workers, mode=Async
    )
    got: list[list[int]] = []

    def run() -> None:
        for batch in loader:
            got.append(batch.flatten().tolist())

    with pytest.raises(ValueError, match="cannot load item 9"):
        within(30, run)
    assert got == [[0, 1], [2, 3], [4, 5], [6, 7]]
    got.clear()
    with pytest.raises(ValueError, match="cannot load item 9"):
        within(30, run)  # the next epoch starts again, and fails again
    assert len(got) == 4
    loader.terminate()
    assert leaks.settled() == ([], [])


# ---- shutdown ------------------------------------------------------------------------------
def test_terminate_leaves_no_threads_or_processes() -> None:
    leaks = Leaks()
    loader = DataLoader(make_options(di=2), tensor_dataset(40), num_workers=2, mode=Async)
    next(iter(loader))
    assert leaks.now()[1]  # the worker process
    loader.terminate()
    loader.terminate()  # idempotent
    assert leaks.now() == ([], [])  # at once, not eventually
    # Iterating again starts afresh.
    assert collect(loader) == collect(DataLoader(make_options(di=2), tensor_dataset(40)))
    loader.terminate()
    assert leaks.settled() == ([], [])


def test_terminate_stops_persistent_workers_of_a_sync_loader() -> None:
    leaks = Leaks()
    loader = DataLoader(make_options(), tensor_dataset(6), batch_size=2, num_workers=1)
    assert len(collect(loader, 2)[1]) == 3
    assert leaks.now()[1]  # the persistent worker is still there
    loader.terminate()
    assert leaks.now() == ([], [])


def test_returned_batches_are_never_overwritten() -> None:
    # Footgun pinned (differs from PopTorch, whose accessor returns views of a shared-memory ring
    # buffer that later batches overwrite): here every batch is a tensor of its own.
    loader = DataLoader(make_options(), tensor_dataset(8), mode=Async)
    try:
        kept = [batch[1] for batch in loader]
        assert torch.cat(kept).tolist() == list(range(8))
    finally:
        loader.terminate()


def test_terminated_accessor_refuses_to_iterate() -> None:
    accessor = AsynchronousDataAccessor(tensor_dataset(3))
    accessor.terminate()
    with pytest.raises(Error, match="has been terminated"):
        iter(accessor)


def test_dropping_an_async_loader_stops_its_thread() -> None:
    leaks = Leaks()
    loader = DataLoader(make_options(), tensor_dataset(10), num_workers=1, mode=Async)
    next(iter(loader))
    del loader
    gc.collect()
    assert leaks.settled() == ([], [])


def test_a_loop_over_a_temporary_async_loader_sees_every_batch() -> None:
    # The loader is a temporary: only the loop's iterator keeps it (and its thread) alive.
    leaks = Leaks()
    got = [
        batch[1].tolist() for batch in DataLoader(make_options(), tensor_dataset(8), mode=Async)
    ]
    expected = [batch[1].tolist() for batch in DataLoader(make_options(), tensor_dataset(8))]
    assert got == expected and len(got) == 8
    gc.collect()
    assert leaks.settled() == ([], [])


# ---- worker cap (footgun: differs from PopTorch) -------------------------------------------
def test_num_workers_is_capped_at_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(workers, "debug_once", said.append)
    monkeypatch.setattr(workers, "available_cores", lambda: 2)
    loader = DataLoader(make_options(), tensor_dataset(4), num_workers=16)
    assert loader.num_workers == 2
    assert len(said) == 1 and "num_workers=16 capped to 2" in said[0]
    with pytest.warns(UserWarning, match="worker processes in total"):  # torch's own warning
        iterable = DataLoader(
            make_options(), CountingIterable(4), num_workers=16, worker_init_fn=lambda _: None
        )
    assert iterable.num_workers == 16  # IterableDatasets: the worker count changes the data


def test_worker_cap_uses_affinity() -> None:
    cores = workers.available_cores()
    assert 1 <= cores <= (multiprocessing.cpu_count() or cores)
    assert workers.capped_num_workers(cores + 14, False) == cores
    assert workers.capped_num_workers(cores + 14, True) == cores + 14


# ---- re-batching helpers -------------------------------------------------------------------
@pytest.mark.parametrize(
    "sizes,size,drop_last,expected",
    [
        ([3, 2], 2, False, [2, 2, 1]),
        ([3, 2], 2, True, [2, 2]),
        ([1, 1, 1, 1], 3, False, [3, 1]),
        ([7], 3, False, [3, 3, 1]),
        ([], 3, False, []),
    ],
    ids=["split", "drop", "join", "one-big", "empty"],
)
def test_rebatch(sizes: list[int], size: int, drop_last: bool, expected: list[int]) -> None:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    batches = [
        (torch.arange(s, s + n), {"k": torch.arange(s, s + n)}) for s, n in zip(starts, sizes)
    ]
    flat = [list(range(sum(sizes)))]
    out = list(rebatch(([b[0]] for b in batches), size, drop_last))
    assert [len(b[0]) for b in out] == expected
    if out:
        assert torch.cat([b[0] for b in out]).tolist() == flat[0][: sum(expected)]
    dict_out = list(rebatch((b[1] for b in batches), size, drop_last))
    assert [len(b["k"]) for b in dict_out] == expected


def test_combine_batches() -> None:
    batches = [torch.tensor([i, i]) for i in range(5)]
    assert [b.tolist() for b in combine_batches(batches, 2, False)] == [
        [0, 0, 1, 1],
        [2, 2, 3, 3],
        [4, 4],
    ]
    assert len(list(combine_batches(batches, 2, True))) == 2
