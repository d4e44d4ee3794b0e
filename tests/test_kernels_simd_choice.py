"""The SIMD variant chooser (poptorch_sim.kernels.simd_choice), pinned with injected timings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from poptorch_sim import kernels
from poptorch_sim.kernels import engine, simd_choice

ALL = engine.SIMD_LEVELS
SUPPORTED = ALL[: ALL.index(kernels.supported_simd_level()) + 1]


@pytest.fixture(autouse=True)
def restore_choices() -> Iterator[None]:
    """Puts back the choices the import made (the tests below overwrite them)."""
    before = {family: engine.set_simd_choice(family, "") for family in engine.simd_families()}
    for family, level in before.items():
        engine.set_simd_choice(family, level)
    yield
    for family, level in before.items():
        engine.set_simd_choice(family, level)


class Timings:
    """An injected timer: fixed seconds per level (per family where given); counts its calls."""

    def __init__(
        self, seconds: dict[str, float], family: dict[str, dict[str, float]] | None = None
    ):
        self.seconds = seconds
        self.family = family or {}
        self.calls: list[tuple[str, str]] = []

    def __call__(self, family: str, level: str) -> float:
        self.calls.append((family, level))
        return self.family.get(family, self.seconds)[level]


def test_families_are_the_sorts_nms_accumulation_and_optimizers() -> None:
    assert engine.simd_families() == [
        "sort_rows_16", "sort_rows_256", "sort_rows_4096", "sort_rows_32768",
        "sort_long", "nms", "accumulate", "optimizer",
    ]  # fmt: skip


def test_picks_the_fastest_variant_of_each_family(tmp_path: Path) -> None:
    timer = Timings(
        {"base": 3.0, "avx2": 1.0, "avx512": 2.0},
        family={"sort_rows_256": {"base": 1.0, "avx2": 2.0, "avx512": 0.5}},
    )
    choices = simd_choice.choose(timer, levels=ALL, path=tmp_path / "c.json", key="cpu")
    assert choices["sort_rows_256"] == "avx512"
    assert all(level == "avx2" for family, level in choices.items() if family != "sort_rows_256")
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
    assert engine.simd_family_level("sort_rows_16") == fastest
    with kernels.simd(SUPPORTED[-1]):  # set_simd_level pins every family
        assert engine.simd_family_level("sort_rows_16") == SUPPORTED[-1]
    assert engine.simd_family_level("sort_rows_16") == fastest
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
    "content", ["{not json", '{"version": 1, "entries": [3]}', '{"version": 99}', '"text"',
                '{"version": 1, "entries": {"cpu": {"nms": {"avx2": "fast", "base": -1}}}}'],
)  # fmt: skip
def test_survives_a_corrupt_cache_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(content)
    timer = Timings({"base": 2.0, "avx2": 1.0})
    assert set(simd_choice.choose(timer, ALL[:2], path, key="cpu").values()) == {"avx2"}
    assert len(timer.calls) == 2 * len(engine.simd_families())
    assert json.loads(path.read_text())["version"] == 1  # rewritten whole


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
    seconds = simd_choice.measure("sort_rows_16", SUPPORTED[0], repeats=1)
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
        assert engine.simd_family_level("sort_rows_16") == SUPPORTED[0]


def test_unknown_names_are_errors() -> None:
    with pytest.raises(RuntimeError, match="unknown kernel family 'sort_rows_7'.*sort_rows_16"):
        engine.set_simd_choice("sort_rows_7", "avx2")
    with pytest.raises(RuntimeError, match="unknown SIMD level 'sse9'"):
        engine.set_simd_choice("nms", "sse9")
    with pytest.raises(ValueError, match="unknown SIMD level 'fast'.*or auto"):
        kernels.set_simd_level("fast")


@pytest.mark.parametrize("level", SUPPORTED)
def test_every_sort_family_gives_the_same_bits_in_every_variant(level: str) -> None:
    g = torch.Generator().manual_seed(5)
    cases = [torch.randn(64, n, generator=g) for n in (13, 200, 3000, 20000)]
    cases.append(torch.randn(1 << 16, generator=g))
    with kernels.tiles(1):
        with kernels.simd(SUPPORTED[-1]):
            widest = [torch.ops.poptorch_sim.sort(x) for x in cases]
        for family in engine.simd_families():
            engine.set_simd_choice(family, level)
        for x, (values, indices) in zip(cases, widest, strict=True):
            got_values, got_indices = torch.ops.poptorch_sim.sort(x)
            assert torch.equal(got_values, values) and torch.equal(got_indices, indices)
            ref_values, ref_indices = torch.sort(x, stable=True)
            assert torch.equal(got_values, ref_values) and torch.equal(got_indices, ref_indices)


def test_measure_0_turns_measuring_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> dict[str, str]:
        raise AssertionError("choose() ran")

    monkeypatch.setattr(simd_choice, "choose", refuse)
    monkeypatch.setenv("POPTORCH_SIM_SIMD_MEASURE", "0")
    simd_choice.apply()


def test_measuring_at_import_leaves_the_counters_at_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(simd_choice, "measure", lambda family, level: 1.0)
    torch.ops.poptorch_sim.sort(torch.randn(10))
    simd_choice.apply()  # an empty cache: every family measured
    assert kernels.counters() == {}
