"""The tutorials run end to end (tiny settings) and print their accuracy. Each runs as
``python script.py`` would run it, but in the test process: a child process would import torch
and transformers again."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch
from in_process import run_script

from poptorch_sim.datasets import write_standin

REPO = Path(__file__).resolve().parent.parent
PIPELINE = REPO / "tutorials" / "pipelining" / "mnist_pipeline.py"
SINGLE_IPU = REPO / "tutorials" / "single_ipu" / "train_mnist.py"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mnist")
    write_standin(root, num_train=1024, num_test=512, variants=4)
    return root


def _run_here(
    script: Path,
    *args: str,
    cwd: Path,
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """What ``script`` printed, run in this process (tests/in_process.py), its child processes
    (the loaders' workers) on one OpenMP thread; it must exit with 0."""
    env = {"OMP_NUM_THREADS": "1"}
    status, out, err = run_script(
        script, *args, cwd=cwd, capfd=capfd, monkeypatch=monkeypatch, env=env
    )
    assert status == 0, f"{script.name} {' '.join(args)} exited {status}:\n{err[-4000:]}"
    return out


def _test_accuracy(stdout: str) -> float:
    """The figure after 'Accuracy on test set:', parsed as the tutorial's own test does."""
    lines = [line for line in stdout.splitlines() if "Accuracy on test set:" in line]
    assert len(lines) == 1, stdout[-2000:]
    value = float(lines[0].split(": ")[-1].strip()[:-1])
    assert 0.0 <= value <= 100.0
    return value


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_accuracy_helper_lines_labels_up_with_the_last_rows() -> None:
    accuracy = _load(PIPELINE).accuracy
    predictions = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.5, 0.4], [0.6, 0.01, 0.39]])
    assert accuracy(predictions[:2], torch.tensor([0, 1])) == 100.0
    assert accuracy(predictions, torch.tensor([0, 1, 2])) == pytest.approx(200 / 3)
    # Final output mode: two predictions are compared with the last two of four labels.
    assert accuracy(predictions[:2], torch.tensor([2, 2, 0, 2])) == 50.0


def test_pipeline_flags_match_graphcore_defaults() -> None:
    args = _load(PIPELINE).parse_args([])
    assert (args.batch_size, args.device_iterations, args.gradient_accumulation) == (40, 10, 10)
    assert (args.test_batch_size, args.epochs, args.learning_rate) == (8, 3, 0.001)
    assert (args.strategy, args.profile, args.profile_dir) == ("pipelined", False, "./profile")
    assert not args.offload_optimiser and not args.debug
    assert args.num_workers == 16  # each data loader's (the tests run with 2)


SMALL = [
    "--epochs", "1", "--batch-size", "8", "--device-iterations", "2",
    "--gradient-accumulation", "8", "--test-batch-size", "8",
    "--max-train-samples", "512", "--max-test-samples", "256", "--num-workers", "2",
]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        ["--strategy", "pipelined"],
        ["--strategy", "sharded", "--offload-optimiser", "--profile", "--debug"],
    ],
    ids=["pipelined", "sharded-offload-profile-debug"],
)
def test_pipeline_tutorial_runs(
    data_dir: Path,
    tmp_path: Path,
    extra: list[str],
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile = tmp_path / "profile"
    out = _run_here(
        PIPELINE, *SMALL, *extra, "--data-dir", str(data_dir), "--profile-dir", str(profile),
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert "generated stand-in" in out
    assert "Training..." in out and "Testing..." in out
    assert ("Profiling is enabled." in out) == ("--profile" in extra)
    _test_accuracy(out)


def test_single_ipu_tutorial_runs(
    data_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _run_here(
        SINGLE_IPU, "--batch-size", "16", "--device-iterations", "8", "--max-steps", "3",
        "--test-batch-size", "32",
        "--data-dir", str(data_dir), cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert "generated stand-in" in out
    _test_accuracy(out)


OVERLAP_IO = REPO / "tutorials" / "overlap_io" / "serve_images.py"


def test_overlap_io_tutorial_serves_from_threads_and_profiles(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = tmp_path / "profile"
    out = _run_here(
        OVERLAP_IO, "--size", "32", "--requests", "6", "--threads", "1", "3",
        "--profile-dir", str(profile), cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert "Served results equal the eager model: True" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["3"])]
    assert [row[0] for row in rows] == ["1", "3"] and all(len(row) == 4 for row in rows)
    traces = list(profile.glob("overlap_io_trace_*.json"))
    assert len(traces) == 1 and traces[0].with_suffix(".png").exists()


def test_overlap_io_tutorial_sizes_io_tiles_by_the_rule() -> None:
    tutorial = _load(OVERLAP_IO)
    # 1024 x 1024 pixels, uint8 RGB in and 10 float32 scores out: 43 MiB / 624 KiB = 71 tiles,
    # rounded up to the next power of two.
    args = tutorial.parse_args(["--batch", "1", "--size", "1024", "--classes", "10"])
    assert tutorial.io_tiles_for(args) == 128
    assert tutorial.io_tiles_for(tutorial.parse_args(["--size", "8"])) == 32  # at least 32
    args = tutorial.parse_args(["--batch", "8", "--size", "1024", "--classes", "10"])
    assert tutorial.io_tiles_for(args) == 192  # at most 192


SHARDING = REPO / "tutorials" / "manual_sharding" / "resnet50_sharding.py"


def test_manual_sharding_yaml_holds_the_tutorials_split_points() -> None:
    from poptorch_sim.compiler.sharding import load_sharding_config

    config = load_sharding_config(SHARDING.parent / "shard.yaml")
    split_points = _load(SHARDING).SPLIT_POINTS
    assert {p.node: (p.device, p.stage) for p in config.points} == {
        node: (ipu, ipu) for node, ipu in split_points.items()
    }


def test_manual_sharding_tutorial_runs_resnet50_pipelined_on_four_ipus(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = tmp_path / "profile"
    out = _run_here(
        SHARDING, "--image-size", "32", "--batch-size", "2", "--num-classes", "10",
        "--gradient-accumulation", "7", "--steps", "1", "--profile-dir", str(profile),
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("stage ") and "ops" in line] == [
        "stage 0 on IPU 0: 15 ops",
        "stage 1 on IPU 1: 133 ops",
        "stage 2 on IPU 2: 3 ops",
        "stage 3 on IPU 3: 25 ops",
    ]
    loss = float(next(line for line in lines if line.startswith("step 0: loss")).split()[-1])
    assert 0.0 < loss < 20.0
    timeline = [line for line in lines if line.startswith("IPU ")]
    assert [line.split("|")[2].split(",")[0].strip() for line in timeline] == [
        f"stage {i}" for i in range(4)
    ]
    assert all("F" in line and "B" in line for line in timeline)
    assert len(list(profile.glob("execution_trace_training_*.json"))) == 1


PACKING = REPO / "tutorials" / "packing" / "packed_bert.py"
PACKING_TINY = [
    "--num-samples", "48", "--max-seq-len", "32", "--mean-len", "16", "--batch-size", "4",
    "--max-sequences-per-pack", "4", "--hidden-size", "32", "--layers", "1", "--producers", "3",
]  # fmt: skip


def test_packing_tutorial_runs_and_packing_changes_no_answer(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    out = _run_here(PACKING, *PACKING_TINY, cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
    assert "48 requests, mean length" in out
    for mode in ("padded", "packed offline", "packed online"):
        assert re.search(rf"^{mode}\s+[\d.]+\s+[\d.]+x\s+[\d.]+$", out, re.M), out
    differences = re.findall(r"mean \|difference\| of outputs, .* vs .*: (\S+)", out)
    assert len(differences) == 3, out
    assert all(float(d) < 1e-5 for d in differences), out
    rows = int(re.search(r"packed them into (\d+) rows", out).group(1))
    assert rows < 48  # packing put several requests in a row


MEMORY = REPO / "tutorials" / "memory" / "memory_planning.py"


def test_memory_tutorial_plans_bert_base_and_gpt2_and_measures_a_tiny_bert(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    out = _run_here(
        MEMORY,
        "--plot-dir",
        str(tmp_path / "plots"),
        cwd=tmp_path,
        capfd=capfd,
        monkeypatch=monkeypatch,
    )
    for model in ("BERT-base", "GPT-2"):
        assert f"=== {model}:" in out
    for variant in ("as is", "offload", "RTS x4", "recompute"):
        assert out.count(f"--- {variant}:") == 2
    assert "optimizer state off chip (streaming memory)" in out
    assert len(list((tmp_path / "plots").glob("*.png"))) == 8
    rows = [line.split() for line in out.splitlines() if "/" in line and line.split()[0].isdigit()]
    assert len(rows) == 3
    assert "with recomputationCheckpoint on every layer" in out
    for row in rows:  # IPU, weights est / measured, optimizer state est / measured, activations
        weights, state, acts = (row[1], row[3]), (row[4], row[6]), (int(row[7]), int(row[9]))
        assert weights[0] == weights[1] and state[0] == state[1]
        assert abs(acts[0] - acts[1]) <= 0.1 * acts[1]


IPU_TIME = REPO / "tutorials" / "ipu_time" / "ipu_time.py"


def test_ipu_time_tutorial_plans_a_faster_split_and_predicts_cycles(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    out = _run_here(
        IPU_TIME, "--hidden", "64", "--seq", "16", "--micro-batch", "2", "--ga", "8",
        "--plot-dir", str(tmp_path / "plots"), cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert out.count("Time per call (prediction for Mk2") == 2
    assert "Time per call (prediction for Bow" in out
    gain = float(re.search(r"ms, ([0-9.]+)x as fast", out).group(1))
    assert gain > 1.2
    assert re.search(r"cycleCount\(\) after one call: [0-9,]+ cycles", out)
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3
