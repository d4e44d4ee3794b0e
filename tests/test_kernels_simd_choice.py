"""The SIMD variant chooser (poptorch_sim.kernels.simd_choice), pinned with injected timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from poptorch_sim import kernels
from poptorch_sim.kernels import engine, simd_choice

ALL = engine.SIMD_LEVELS
SUPPORTED = ALL[: ALL.index(kernels.supported_simd_level()) + 1]
UNDER_CAP = ALL[: ALL.index(kernels.simd_level()) + 1]  # those POPTORCH_SIM_SIMD allows


@pytest.fixture(autouse=True)
def restore_choices() -> Iterator[None]:
    """Puts back the choices made so far (the tests below overwrite them)."""
    before = {family: engine.set_simd_choice(family, "") for family in engine.simd_families()}
    for family, level in before.items():
        engine.set_simd_choice(family, level)
    yield
    for family, level in before.items():
        engine.set_simd_choice(family, level)


class StoreTimings:
    """An injected timer of the stores' modes: fixed seconds per mode; counts its calls."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds = seconds
        self.calls: list[str] = []

    def __call__(self, mode: str) -> float:
        self.calls.append(mode)
        return self.seconds[mode]


class Timings:
    """An injected timer: fixed seconds per level (per family where given); counts its calls."""

    def __init__(
        self, seconds: dict[str, float], family: dict[str, dict[str, float]] | None = None
    ):
        self.seconds = seconds
        self.family = family or {}
        self.calls: list[tuple[str, str]] = []
        self.stores = StoreTimings({"plain": 2.0, "stream": 1.0})  # the stores' timer

    def __call__(self, family: str, level: str) -> float:
        self.calls.append((family, level))
        return self.family.get(family, self.seconds)[level]


@pytest.fixture(autouse=True)
def restore_stores() -> Iterator[None]:
    """Puts back the stores' choice (the tests below change it)."""
    before = engine.stream_mid_rows()
    yield
    engine.set_stream_mid_rows(before)


def test_families_are_the_sorts_nms_accumulation_and_optimizers() -> None:
    assert engine.simd_families() == [
        f"sort_rows_{length}_{bits}bit"
        for length in (16, 256, 1024, 4096, 32768)
        for bits in (16, 32, 64)
    ] + ["sort_long_16bit", "sort_long_32bit", "nms", "accumulate", "optimizer"]


@pytest.mark.parametrize(
    ("dtype", "bits"),
    [(torch.float16, 16), (torch.bfloat16, 16), (torch.int16, 16), (torch.float32, 32),
     (torch.int32, 32), (torch.int8, 32), (torch.uint8, 32), (torch.float64, 64),
     (torch.int64, 64)],
)  # fmt: skip
def test_sort_family_is_by_row_length_class_and_key_width(dtype: torch.dtype, bits: int) -> None:
    def family(*shape: int, dim: int = -1) -> str | None:
        return simd_choice.sort_family(torch.zeros(shape, dtype=dtype), dim)

    assert family(4, 16) == f"sort_rows_16_{bits}bit"
    assert family(300, 4, dim=0) == f"sort_rows_1024_{bits}bit"
    assert family(3, 1025) == f"sort_rows_4096_{bits}bit"
    assert family(2, 32768) == f"sort_rows_32768_{bits}bit"
    assert family(32769) == (None if bits == 64 else f"sort_long_{bits}bit")


def test_picks_the_fastest_variant_of_each_family(tmp_path: Path) -> None:
    timer = Timings(
        {"base": 3.0, "avx2": 1.0, "avx512": 2.0},
        family={"sort_rows_256_32bit": {"base": 1.0, "avx2": 2.0, "avx512": 0.5}},
    )
    choices = simd_choice.choose(timer, levels=ALL, path=tmp_path / "c.json", key="cpu")
    assert choices["sort_rows_256_32bit"] == "avx512"
    assert all(
        level == "avx2" for family, level in choices.items() if family != "sort_rows_256_32bit"
    )
    assert len(timer.calls) == len(engine.simd_families()) * len(ALL)


def test_a_tie_goes_to_the_wider_variant(tmp_path: Path) -> None:
    timer = Timings({"base": 1.0, "avx2": 1.0, "avx512": 2.0})
    choices = simd_choice.choose(timer, levels=ALL, path=tmp_path / "c.json", key="cpu")
    assert set(choices.values()) == {"avx2"}


def test_times_only_the_variants_under_the_cap(tmp_path: Path) -> None:
    timer = Timings({"base": 2.0, "avx2": 1.5, "avx512": 0.1})
    choices = simd_choice.choose(timer, levels=ALL[:2], path=tmp_path / "c.json", key="cpu")
    assert set(choices.values()) == {"avx2"}
    assert {level for _, level in timer.calls} == {"base", "avx2"}


def test_the_running_variant_is_the_choice_under_the_cap(tmp_path: Path) -> None:
    fastest = SUPPORTED[0]  # base: a level every CPU runs
    timer = Timings({level: 1.0 + (level != fastest) for level in ALL})
    simd_choice.choose(timer, levels=SUPPORTED, path=tmp_path / "c.json", key="cpu")
    assert engine.simd_family_level("sort_rows_16_32bit") == fastest
    with kernels.simd(SUPPORTED[-1]):  # set_simd_level pins every family
        assert engine.simd_family_level("sort_rows_16_32bit") == SUPPORTED[-1]
    assert engine.simd_family_level("sort_rows_16_32bit") == fastest
    # a choice above the cap runs the cap
    engine.set_simd_choice("nms", "avx512")
    assert engine.simd_family_level("nms") == kernels.simd_level()


def test_reuses_the_cache_and_measures_only_what_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    first = simd_choice.choose(Timings({"base": 2.0, "avx2": 1.0}), ALL[:2], path, key="cpu")
    again = Timings({"base": 0.1, "avx2": 9.0, "avx512": 0.5})
    assert simd_choice.choose(again, ALL[:2], path, key="cpu") == first
    assert again.calls == []
    # a third level: only it is timed, against the cached two
    widest = simd_choice.choose(again, ALL, path, key="cpu")
    assert {level for _, level in again.calls} == {"avx512"}
    assert set(widest.values()) == {"avx512"}
    # another CPU or build: its own entry
    other = Timings({"base": 1.0, "avx2": 2.0})
    assert set(simd_choice.choose(other, ALL[:2], path, key="other cpu").values()) == {"base"}
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {"cpu", "other cpu"}


@pytest.mark.parametrize(
    "content", ["{not json", '{"version": 2, "entries": [3]}', '{"version": 99}', '"text"',
                '{"version": 2, "entries": {"cpu": {"nms": {"avx2": "fast", "base": -1}}}}',
                # the families of version 1 (one per row length class, any key width)
                '{"version": 1, "entries": {"cpu": {"sort_rows_16": {"base": 1, "avx2": 2}}}}'],
)  # fmt: skip
def test_survives_a_corrupt_cache_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(content)
    timer = Timings({"base": 2.0, "avx2": 1.0})
    assert set(simd_choice.choose(timer, ALL[:2], path, key="cpu").values()) == {"avx2"}
    assert len(timer.calls) == 2 * len(engine.simd_families())
    assert json.loads(path.read_text())["version"] == simd_choice._VERSION  # rewritten whole


def test_an_unwritable_cache_is_left_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    timer = Timings({"base": 2.0, "avx2": 1.0})
    choices = simd_choice.choose(timer, ALL[:2], blocker / "sub" / "c.json", key="cpu")
    assert set(choices.values()) == {"avx2"}


def test_default_cache_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert simd_choice.cache_file() == tmp_path / "poptorch_sim" / "simd_choice.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert simd_choice.cache_file() == Path.home() / ".cache" / "poptorch_sim" / "simd_choice.json"


def test_measure_and_report_on_this_cpu(tmp_path: Path) -> None:
    seconds = simd_choice.measure("sort_rows_16_32bit", SUPPORTED[0], repeats=1)
    assert 0 < seconds < 10
    timer = Timings({level: 1.0 for level in ALL})
    simd_choice.choose(timer, SUPPORTED, tmp_path / "c.json")
    report = simd_choice.simd_report(tmp_path / "c.json")
    assert simd_choice.cpu_model() in report
    assert all(family in report for family in engine.simd_families())
    assert "1000.000" in report  # the injected second, in ms


def test_pinned_level_is_restored_after_choosing(tmp_path: Path) -> None:
    with kernels.simd(SUPPORTED[0]):
        simd_choice.choose(Timings({lv: 1.0 for lv in ALL}), SUPPORTED, tmp_path / "c.json", "cpu")
        assert kernels.simd_level() == SUPPORTED[0]
        assert engine.simd_family_level("sort_rows_16_32bit") == SUPPORTED[0]


def test_unknown_names_are_errors() -> None:
    with pytest.raises(RuntimeError, match="unknown kernel family 'sort_rows_7'.*sort_rows_16"):
        engine.set_simd_choice("sort_rows_7", "avx2")
    with pytest.raises(RuntimeError, match="unknown SIMD level 'sse9'"):
        engine.set_simd_choice("nms", "sse9")
    with pytest.raises(ValueError, match="unknown SIMD level 'fast'.*or auto"):
        kernels.set_simd_level("fast")


def capped(level: str) -> str:
    """The variant a family chosen at ``level`` runs: ``level`` under the cap."""
    return ALL[min(ALL.index(level), ALL.index(kernels.simd_level()))]


SORT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int16, torch.int32, torch.int8,
               torch.uint8, torch.float64, torch.int64]  # fmt: skip


def sort_cases(dtype: torch.dtype) -> list[torch.Tensor]:
    """Rows of every length class and a long row (ties for the integer dtypes)."""
    g = torch.Generator().manual_seed(5)
    shapes = [(64, 13), (16, 200), (8, 3000), (4, 20000), (1 << 16,)]
    if dtype.is_floating_point:
        return [torch.randn(shape, generator=g).to(dtype) for shape in shapes]
    span = 1 << 40 if dtype == torch.int64 else 1 << 12  # int64: keys wider than 32 bits
    low = 0 if dtype == torch.uint8 else -span
    high = 256 if dtype == torch.uint8 else span
    return [torch.randint(low, high, shape, generator=g).to(dtype) for shape in shapes]


@pytest.mark.parametrize("dtype", SORT_DTYPES)
@pytest.mark.parametrize("level", SUPPORTED)
def test_every_sort_family_gives_the_same_bits_in_every_variant(
    level: str, dtype: torch.dtype
) -> None:
    cases = sort_cases(dtype)
    with kernels.tiles(1):
        with kernels.simd(SUPPORTED[-1]):
            widest = [torch.ops.poptorch_sim.sort(x) for x in cases]
        for family in engine.simd_families():
            engine.set_simd_choice(family, level)
        for x, (values, indices) in zip(cases, widest, strict=True):
            family = simd_choice.sort_family(x)
            before = engine.simd_family_runs(family) if family else None
            got_values, got_indices = torch.ops.poptorch_sim.sort(x)
            if family:  # the variant chosen for the dtype's family ran (under the cap)
                ran = capped(level)
                assert engine.simd_family_runs(family)[ran] == before[ran] + 1
            assert torch.equal(got_values, values) and torch.equal(got_indices, indices)
            ref_values, ref_indices = torch.sort(x, stable=True)
            assert torch.equal(got_values, ref_values) and torch.equal(got_indices, ref_indices)


def test_each_key_width_runs_its_own_choice(tmp_path: Path) -> None:
    if len(UNDER_CAP) < 2:
        pytest.skip("one SIMD variant under the cap on this CPU: nothing to choose")
    widest, narrower = UNDER_CAP[-1], UNDER_CAP[-2]
    fast = {level: 1.0 + (level != widest) for level in ALL}  # the widest fastest
    slow = {level: 1.0 + (level != narrower) for level in ALL}  # a narrower one fastest
    timer = Timings(fast, family={"sort_rows_256_16bit": slow, "sort_rows_256_64bit": slow})
    choices = simd_choice.choose(timer, UNDER_CAP, path=tmp_path / "c.json", key="cpu")
    assert choices["sort_rows_256_16bit"] == choices["sort_rows_256_64bit"] == narrower
    assert choices["sort_rows_256_32bit"] == widest
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 100, generator=g) * 20
    for dtype, level in [(torch.float16, narrower), (torch.bfloat16, narrower),
                         (torch.int16, narrower), (torch.float32, widest), (torch.int32, widest),
                         (torch.int8, widest), (torch.float64, narrower),
                         (torch.int64, narrower)]:  # fmt: skip
        y = x.to(dtype)
        family = simd_choice.sort_family(y)
        assert family is not None
        before = engine.simd_family_runs(family)
        values, indices = torch.ops.poptorch_sim.sort(y, -1, True)  # (no wrapper: no chooser)
        after = engine.simd_family_runs(family)
        assert {lv: after[lv] - before[lv] for lv in ALL} == {lv: lv == level for lv in ALL}
        ref = torch.sort(y, descending=True, stable=True)
        assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)


@pytest.mark.parametrize("level", SUPPORTED)
def test_each_sort_family_is_measured_on_its_own_kernel(level: str) -> None:
    for family in engine.simd_families():
        if not family.startswith("sort_"):
            continue
        before = engine.simd_family_runs(family)
        simd_choice.measure(family, level, repeats=1)
        after = engine.simd_family_runs(family)
        ran = capped(level)
        assert {lv: after[lv] - before[lv] for lv in ALL} == {lv: 2 * (lv == ran) for lv in ALL}


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Timings:
    """A process in which no family is chosen yet, an empty cache and an injected timer."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(simd_choice, "_settled", set())
    for family in engine.simd_families():  # (restore_choices puts them back)
        engine.set_simd_choice(family, "")
    timer = Timings({"base": 2.0, "avx2": 1.0, "avx512": 3.0})
    monkeypatch.setattr(simd_choice, "measure", timer)
    monkeypatch.setattr(simd_choice, "measure_stores", timer.stores)
    engine.set_stream_mid_rows(False)
    return timer


def cached_families(key: str | None = None) -> set[str]:
    entries = json.loads(simd_choice.cache_file().read_text())["entries"]
    return set(entries[key or simd_choice._key()])


def test_importing_measures_nothing_and_reads_the_cached_choices(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    script = (
        "from poptorch_sim.kernels import engine, simd_choice as sc\n"
        "print(sorted(sc.settled()), engine.simd_family_level('sort_rows_16_32bit'))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(root)}
    env.pop("POPTORCH_SIM_SIMD", None)
    env.pop("POPTORCH_SIM_SIMD_MEASURE", None)
    # times for one family: its choice is set at import, no other family is measured
    path = tmp_path / "poptorch_sim" / "simd_choice.json"
    slowest_widest = {level: 1.0 + (level == SUPPORTED[-1]) for level in SUPPORTED}
    simd_choice._merge(path, simd_choice._key(), {"sort_rows_16_32bit": slowest_widest})
    before = path.read_text()
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, check=True,
                         capture_output=True, text=True)  # fmt: skip
    want = SUPPORTED[-1] if len(SUPPORTED) == 1 else SUPPORTED[-2]
    assert out.stdout.strip() == f"['sort_rows_16_32bit'] {want}"
    assert path.read_text() == before


def test_a_family_is_measured_once_on_first_use(fresh: Timings) -> None:
    x = torch.randn(8, 100)
    values, indices = kernels.sort(x)
    assert fresh.calls == [("sort_rows_256_32bit", level) for level in UNDER_CAP]
    assert engine.simd_family_level("sort_rows_256_32bit") == (
        "avx2" if "avx2" in UNDER_CAP else "base"
    )
    ref = torch.sort(x, stable=True)
    assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)
    kernels.sort(x, descending=True)
    kernels.argsort(x.t(), dim=0)  # the same row length class
    assert len(fresh.calls) == len(UNDER_CAP)
    # rows of 100: the stores' choice too, once
    assert simd_choice.settled() == {"sort_rows_256_32bit", "sort_stores"}
    assert fresh.stores.calls == ["plain", "stream"]
    assert engine.stream_mid_rows()
    kernels.sort(torch.randn(3, 10))
    kernels.topk(torch.randn(3, 10), 2)  # top-k: no SIMD variants, no choice
    assert simd_choice.settled() == {"sort_rows_256_32bit", "sort_rows_16_32bit", "sort_stores"}
    assert cached_families() == {"sort_rows_256_32bit", "sort_rows_16_32bit", "sort_stores"}


def test_each_wrapper_chooses_its_family(fresh: Timings) -> None:
    boxes = torch.tensor([[0.0, 0, 2, 2], [0, 0, 2, 1.9], [5, 5, 6, 6]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert kernels.nms(boxes, scores, 0.5).tolist() == [0, 2]
    # NMS sorts the scores as one row
    assert simd_choice.settled() == {"nms", "sort_rows_16_32bit"}
    kernels.sort(torch.randn(1 << 16))
    kernels.accumulate_(torch.zeros(4), torch.ones(4))
    kernels.grad_norm([torch.ones(4)])
    assert simd_choice.settled() == {"nms", "sort_rows_16_32bit", "sort_long_32bit", "accumulate",
                                     "optimizer"}  # fmt: skip


def test_other_families_and_entries_in_the_cache_survive(fresh: Timings) -> None:
    path = simd_choice.cache_file()
    key = simd_choice._key()
    times = {level: 1.0 + (level != "base") for level in ALL}
    simd_choice._merge(path, key, {"nms": times, "optimizer": times})
    simd_choice._merge(path, "other cpu", {"nms": {"base": 5.0}})
    kernels.sort(torch.randn(2, 1300))
    kernels.nms(torch.tensor([[0.0, 0, 1, 1]]), torch.tensor([1.0]), 0.5)  # cached: not timed
    assert {family for family, _ in fresh.calls} == {"sort_rows_4096_32bit", "sort_rows_16_32bit"}
    assert engine.simd_family_level("nms") == "base"
    entries = json.loads(path.read_text())["entries"]
    assert entries["other cpu"] == {"nms": {"base": 5.0}}
    assert set(entries[key]) == {"nms", "optimizer", "sort_rows_4096_32bit", "sort_rows_16_32bit"}
    assert entries[key]["nms"] == times


def test_concurrent_writers_keep_every_family(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    families = [f"family_{i}" for i in range(8)]

    def write(family: str) -> None:
        for level in ALL:
            simd_choice._merge(path, "cpu", {family: {level: 1.0}})

    threads = [threading.Thread(target=write, args=(family,)) for family in families]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entry = json.loads(path.read_text())["entries"]["cpu"]
    assert entry == {family: {level: 1.0 for level in ALL} for family in families}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "c.json.lock"]  # no temp


def test_first_use_keeps_the_counters_and_the_pinned_level(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(simd_choice, "_settled", set())
    kernels.reset_counters()
    with kernels.simd(SUPPORTED[0]):
        kernels.sort(torch.randn(4, 10))  # measured for real: the sample's sorts run
        assert kernels.simd_level() == SUPPORTED[0]
    assert simd_choice.settled() == {"sort_rows_16_32bit"}
    assert kernels.counters()["sort"].calls == 1
    kernels.sort(torch.randn(3))
    assert kernels.counters()["sort"].calls == 2
    kernels.reset_counters()
    assert kernels.counters() == {}


def test_traced_fake_and_meta_calls_measure_nothing(fresh: Timings) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        kernels.sort(torch.empty(3, 100))
    kernels.sort(torch.empty(3, 100, device="meta"))
    torch.compile(kernels.sort, backend="eager", fullgraph=True)(torch.randn(3, 100))
    assert fresh.calls == [] and simd_choice.settled() == set()


def test_report_measures_every_family_not_measured_yet(fresh: Timings) -> None:
    kernels.sort(torch.randn(10))
    report = kernels.simd_report()
    assert len(fresh.calls) == len(engine.simd_families()) * len(UNDER_CAP)
    assert simd_choice.settled() == {*engine.simd_families(), "sort_stores"}
    assert "plain 2000.000, stream 1000.000; runs stream" in report
    assert "2000.000" in report  # base's injected seconds
    assert ("1000.000" in report) == ("avx2" in UNDER_CAP)  # avx2's


def test_measure_0_turns_measuring_off(fresh: Timings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPTORCH_SIM_SIMD_MEASURE", "0")
    simd_choice._merge(simd_choice.cache_file(), simd_choice._key(),
                       {"nms": {level: 1.0 for level in ALL}})  # fmt: skip
    assert simd_choice.load() == []
    kernels.sort(torch.randn(10))
    kernels.simd_report()
    assert fresh.calls == []
    assert cached_families() == {"nms"}


def test_a_failed_measurement_warns_and_runs_the_cap(
    fresh: Timings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(family: str, level: str) -> float:
        raise RuntimeError("no timer here")

    monkeypatch.setattr(simd_choice, "measure", broken)
    x = torch.randn(5, 20)
    assert torch.equal(kernels.sort(x).values, torch.sort(x).values)
    assert (
        "choosing the SIMD variant of sort_rows_256_32bit, sort_stores failed (RuntimeError: no "
        "timer" in caplog.text
    )
    # not tried again on every call; rows of 100 keep ordinary stores
    assert simd_choice.settled() == {"sort_rows_256_32bit", "sort_stores"}
    assert engine.simd_family_level("sort_rows_256_32bit") == kernels.simd_level()
    assert not engine.stream_mid_rows()


def test_stores_take_the_faster_mode_once_per_machine(tmp_path: Path) -> None:
    path = tmp_path / "choice.json"
    timer = StoreTimings({"plain": 2.0, "stream": 1.0})
    assert simd_choice.choose_stores(timer, path=path, key="cpu") == "stream"
    assert engine.stream_mid_rows() and timer.calls == ["plain", "stream"]
    # the cache answers the next time; the families' entries beside it are kept
    simd_choice._merge(path, "cpu", {"nms": {"base": 1.0}})
    assert simd_choice.choose_stores(StoreTimings({}), path=path, key="cpu") == "stream"
    assert set(json.loads(path.read_text())["entries"]["cpu"]) == {"nms", "sort_stores"}
    # a tie keeps ordinary stores; a half-cached entry is measured for the other mode only
    timer = StoreTimings({"plain": 1.0, "stream": 1.0})
    assert simd_choice.choose_stores(timer, path=path, key="tie") == "plain"
    assert not engine.stream_mid_rows()
    simd_choice._merge(path, "half", {"sort_stores": {"plain": 3.0}})
    timer = StoreTimings({"plain": 0.0, "stream": 1.0})
    assert simd_choice.choose_stores(timer, path=path, key="half") == "stream"
    assert timer.calls == ["stream"]


def test_load_sets_the_cached_stores_choice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(simd_choice, "_settled", set())
    path = tmp_path / "choice.json"
    engine.set_stream_mid_rows(False)
    simd_choice._merge(path, simd_choice._key(), {"sort_stores": {"plain": 2.0}})
    assert "sort_stores" not in simd_choice.load(path)  # one mode timed: not a choice yet
    simd_choice._merge(path, simd_choice._key(), {"sort_stores": {"stream": 1.0}})
    assert simd_choice.load(path) == ["sort_stores"]
    assert engine.stream_mid_rows()


def test_only_rows_of_17_to_1023_choose_the_stores(fresh: Timings) -> None:
    kernels.sort(torch.randn(4, 16))
    kernels.sort(torch.randn(2, 2000))
    assert "sort_stores" not in simd_choice.settled()
    kernels.sort(torch.randn(2, 1000))  # the 1024 class
    assert "sort_stores" in simd_choice.settled()


def test_measure_stores_on_this_cpu() -> None:
    before = engine.stream_mid_rows()
    for mode in simd_choice.STORE_MODES:
        assert 0 < simd_choice.measure_stores(mode, repeats=1) < 10
        assert engine.stream_mid_rows() == before
    with pytest.raises(ValueError, match="unknown store mode 'fast'; use one of plain, stream"):
        simd_choice.measure_stores("fast")


def test_first_use_honours_the_cap(fresh: Timings) -> None:
    old = os.environ.get("POPTORCH_SIM_SIMD")
    os.environ["POPTORCH_SIM_SIMD"] = "base"  # read again by set_simd_level("auto")
    try:
        kernels.sort(torch.randn(2, 10))
        assert fresh.calls == [("sort_rows_16_32bit", "base")]
        assert engine.simd_family_level("sort_rows_16_32bit") == "base"
    finally:
        if old is None:
            del os.environ["POPTORCH_SIM_SIMD"]
        else:
            os.environ["POPTORCH_SIM_SIMD"] = old
        kernels.set_simd_level("auto")
    if old is None:
        assert kernels.simd_level() == SUPPORTED[-1]  # the cap is lifted again
