"""MNIST stand-in: torchvision reads it, it is deterministic, and ensure_mnist picks the right data."""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import pytest
import torch
import torchvision

from poptorch_sim.datasets import (
    MNIST_FILES,
    ensure_mnist,
    mnist_standin,
    raw_folder,
    write_standin,
)

NUM_TRAIN, NUM_TEST, NOISE, VARIANTS = 600, 200, 0.05, 4


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("standin")
    write_standin(
        root,
        num_train=NUM_TRAIN,
        num_test=NUM_TEST,
        seed=0,
        test_label_noise=NOISE,
        variants=VARIANTS,
    )
    return root


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any download attempt by torchvision fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("torchvision tried to download MNIST")

    monkeypatch.setattr(torchvision.datasets.mnist, "download_and_extract_archive", refuse)


def _read(root: Path, train: bool) -> torchvision.datasets.MNIST:
    return torchvision.datasets.MNIST(str(root), train=train, download=True)


def _bytes(root: Path) -> dict[str, bytes]:
    return {name: (raw_folder(root) / name).read_bytes() for name in MNIST_FILES}


@pytest.mark.parametrize("train", [True, False], ids=["train", "test"])
def test_torchvision_reads_standin_without_downloading(
    standin: Path, no_network: None, train: bool
) -> None:
    ds = _read(standin, train)
    size = NUM_TRAIN if train else NUM_TEST
    assert ds.data.shape == (size, 28, 28)
    assert ds.data.dtype == torch.uint8
    assert ds.targets.dtype == torch.int64
    assert int(ds.targets.min()) >= 0 and int(ds.targets.max()) <= 9
    assert torch.bincount(ds.targets, minlength=10).min() > 0
    image, label = ds[0]
    assert image.size == (28, 28) and isinstance(label, int)


def test_pixels_look_like_mnist(standin: Path) -> None:
    pixels = _read(standin, True).data.float() / 255
    # MNIST: mean 0.13, std 0.31, mostly black background, saturated strokes.
    assert 0.08 < pixels.mean() < 0.2
    assert 0.22 < pixels.std() < 0.4
    assert (pixels < 0.1).float().mean() > 0.7
    assert pixels.amax(dim=(1, 2)).min() > 0.6


def test_idx_headers(standin: Path) -> None:
    images = (raw_folder(standin) / "train-images-idx3-ubyte").read_bytes()
    labels = (raw_folder(standin) / "t10k-labels-idx1-ubyte").read_bytes()
    assert struct.unpack(">IIII", images[:16]) == (0x803, NUM_TRAIN, 28, 28)
    assert len(images) == 16 + NUM_TRAIN * 28 * 28
    assert struct.unpack(">II", labels[:8]) == (0x801, NUM_TEST)
    assert len(labels) == 8 + NUM_TEST


def test_same_seed_same_bytes(standin: Path, tmp_path: Path) -> None:
    write_standin(
        tmp_path,
        num_train=NUM_TRAIN,
        num_test=NUM_TEST,
        seed=0,
        test_label_noise=NOISE,
        variants=VARIANTS,
    )
    assert _bytes(tmp_path) == _bytes(standin)


def test_other_seed_other_images(standin: Path, tmp_path: Path) -> None:
    write_standin(
        tmp_path,
        num_train=NUM_TRAIN,
        num_test=NUM_TEST,
        seed=1,
        test_label_noise=NOISE,
        variants=VARIANTS,
    )
    assert not torch.equal(_read(tmp_path, True).data, _read(standin, True).data)


def test_test_label_noise_changes_only_that_many_test_labels(
    standin: Path, tmp_path: Path
) -> None:
    write_standin(
        tmp_path,
        num_train=NUM_TRAIN,
        num_test=NUM_TEST,
        seed=0,
        test_label_noise=0.0,
        variants=VARIANTS,
    )
    clean_train, noisy_train = _read(tmp_path, True), _read(standin, True)
    clean_test, noisy_test = _read(tmp_path, False), _read(standin, False)
    torch.testing.assert_close(clean_train.data, noisy_train.data)
    torch.testing.assert_close(clean_train.targets, noisy_train.targets)
    torch.testing.assert_close(clean_test.data, noisy_test.data)
    changed = int((clean_test.targets != noisy_test.targets).sum())
    assert changed == round(NOISE * NUM_TEST)


def test_classes_are_separable(standin: Path) -> None:
    """Even a nearest-class-mean classifier beats chance by far: the digits carry their class."""
    train, test = _read(standin, True), _read(standin, False)
    x = train.data.flatten(1).float()
    means = torch.stack([x[train.targets == d].mean(0) for d in range(10)])
    predicted = torch.cdist(test.data.flatten(1).float(), means).argmin(1)
    assert (predicted == test.targets).float().mean() > 0.6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_train": -1}, "num_train and num_test must be >= 0, got -1 and 10"),
        ({"test_label_noise": 1.5}, r"test_label_noise must be in \[0, 1\], got 1.5"),
        ({"variants": 0}, "variants must be >= 1, got 0"),
    ],
    ids=["negative-size", "noise-above-one", "no-variants"],
)
def test_write_standin_rejects_bad_arguments(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        write_standin(tmp_path, **{"num_train": 10, "num_test": 10, **kwargs})


@pytest.fixture
def small_standin(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """ensure_mnist generates a small stand-in; records where."""
    written: list[Path] = []

    def small(root: Path, seed: int = 0) -> Path:
        written.append(Path(root))
        return write_standin(root, num_train=50, num_test=20, seed=seed, variants=2)

    monkeypatch.setattr(mnist_standin, "write_standin", small)
    return written


def _fail_download(root: Path) -> bool:
    raise AssertionError("ensure_mnist tried the network")


def test_real_files_are_used_untouched(
    standin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    small_standin: list[Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = raw_folder(tmp_path)
    folder.mkdir(parents=True)
    for name, data in _bytes(standin).items():
        (folder / name).write_bytes(data)  # no stand-in marker: these count as real MNIST
    monkeypatch.setattr(mnist_standin, "_try_download", _fail_download)
    assert ensure_mnist(tmp_path) == "real"
    assert small_standin == []
    assert _bytes(tmp_path) == _bytes(standin)
    assert "using real MNIST" in capsys.readouterr().out


def test_offline_generates_then_reuses(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    small_standin: list[Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("POPTORCH_SIM_OFFLINE", "1")
    monkeypatch.setattr(mnist_standin, "_try_download", _fail_download)
    assert ensure_mnist(tmp_path) == "generated"
    assert ensure_mnist(tmp_path) == "generated"
    assert small_standin == [tmp_path]  # written once, then reused
    assert len(_read(tmp_path, True)) == 50
    assert "generated stand-in" in capsys.readouterr().out


def test_failed_download_falls_back_to_standin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_standin: list[Path]
) -> None:
    monkeypatch.delenv("POPTORCH_SIM_OFFLINE", raising=False)
    attempts: list[Path] = []
    monkeypatch.setattr(
        mnist_standin, "_try_download", lambda root: attempts.append(root) or False
    )
    assert ensure_mnist(tmp_path, verbose=False) == "generated"
    assert attempts == [tmp_path]
    assert small_standin == [tmp_path]


def test_successful_download_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_standin: list[Path]
) -> None:
    def fake_download(root: Path) -> bool:
        write_standin(root, num_train=5, num_test=5, variants=1)
        (raw_folder(root) / mnist_standin.STANDIN_MARKER).unlink()
        return True

    monkeypatch.setattr(mnist_standin, "_try_download", fake_download)
    assert ensure_mnist(tmp_path, download=True, verbose=False) == "downloaded"
    assert ensure_mnist(tmp_path, download=True, verbose=False) == "real"
    assert small_standin == []


def test_outdated_standin_is_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_standin: list[Path]
) -> None:
    write_standin(tmp_path, num_train=5, num_test=5, variants=1)
    monkeypatch.setattr(mnist_standin, "STANDIN_VERSION", mnist_standin.STANDIN_VERSION + 1)
    monkeypatch.setattr(mnist_standin, "_try_download", _fail_download)
    assert ensure_mnist(tmp_path, verbose=False) == "generated"
    assert small_standin == [tmp_path]


def test_command_line_writes_standin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_standin: list[Path]
) -> None:
    from poptorch_sim.datasets.__main__ import main

    monkeypatch.setattr(mnist_standin, "_try_download", _fail_download)
    main([str(tmp_path), "--offline"])
    assert small_standin == [tmp_path]
    assert functools.reduce(
        lambda ok, n: ok and (raw_folder(tmp_path) / n).is_file(), MNIST_FILES, True
    )
