"""MNIST for offline machines: real files when present, else a download, else a generated stand-in.

``torchvision.datasets.MNIST(root, download=True)`` skips its download when the four
uncompressed IDX files exist under ``<root>/MNIST/raw/`` (it only checks that they exist).
:func:`ensure_mnist` makes sure they do, so an unmodified PopTorch program that reads MNIST
that way runs on a machine without network access.

The stand-in (:func:`write_standin`) has MNIST's format, sizes and pixel statistics and ten
learnable digit classes drawn by :mod:`.glyphs`. It is harder than a toy set but easier than
real handwriting, so a small fraction of its *test* labels is deliberately wrong: a small CNN
scores about 98-99% rather than a perfect 100%, and tests that expect MNIST-like accuracy
(for instance ``97.5 < accuracy < 99.9``) still mean something.

Simulated: accuracy figures obtained on the stand-in are not MNIST results.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from pathlib import Path
from typing import Literal

import torch

from .. import env
from .glyphs import IMAGE_SIZE, render_split

__all__ = [
    "MNIST_FILES",
    "STANDIN_MARKER",
    "Source",
    "ensure_mnist",
    "raw_folder",
    "write_standin",
]

Source = Literal["real", "downloaded", "generated"]

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
STANDIN_MARKER = "poptorch_sim_standin.json"
STANDIN_VERSION = 1
_DOWNLOAD_HOST = ("ossci-datasets.s3.amazonaws.com", 443)
_NETWORK_TIMEOUT_S = 5.0


def raw_folder(root: str | os.PathLike[str]) -> Path:
    """The folder torchvision's MNIST reads: ``<root>/MNIST/raw`` (``~`` expanded)."""
    return Path(os.path.expanduser(os.fspath(root))) / "MNIST" / "raw"


def _write_idx(path: Path, data: torch.Tensor) -> None:
    """Write a uint8 tensor as a big-endian IDX file (MNIST's format), atomically."""
    header = struct.pack(">HBB", 0, 0x08, data.dim()) + struct.pack(f">{data.dim()}I", *data.shape)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(header)
        handle.write(data.contiguous().numpy().tobytes())
    os.replace(tmp, path)


def _noisy_labels(labels: torch.Tensor, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """Replace ``fraction`` of ``labels`` by a different, random digit."""
    count = round(fraction * labels.numel())
    chosen = torch.randperm(labels.numel(), generator=gen)[:count]
    noisy = labels.clone()
    noisy[chosen] = (labels[chosen] + torch.randint(1, 10, (count,), generator=gen)) % 10
    return noisy


def write_standin(
    root: str | os.PathLike[str],
    *,
    num_train: int = 60_000,
    num_test: int = 10_000,
    seed: int = 0,
    test_label_noise: float = 0.01,
    variants: int = 64,
) -> Path:
    """Generate the MNIST-format stand-in under ``<root>/MNIST/raw``.

    Writes the four IDX files torchvision reads plus a small JSON marker naming the generator,
    so :func:`ensure_mnist` can tell the stand-in from real MNIST later. Output is a pure
    function of the arguments.

    Args:
        root: dataset root, as passed to ``torchvision.datasets.MNIST``.
        num_train: training images (default 60,000, as MNIST).
        num_test: test images (default 10,000, as MNIST).
        seed: seeds every random choice (default 0).
        test_label_noise: fraction of test labels replaced by a wrong digit (default 0.01).
        variants: distinct "writers" per digit and split (default 64); fewer is faster.

    Returns:
        The raw folder written.

    Raises:
        ValueError: a size is negative or ``test_label_noise`` is outside [0, 1].

    >>> folder = write_standin("/tmp/mnist", num_train=100, num_test=10)  # doctest: +SKIP
    """
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got {num_train} and {num_test}")
    if variants < 1:
        raise ValueError(f"variants must be >= 1, got {variants}")
    if not 0.0 <= test_label_noise <= 1.0:
        raise ValueError(f"test_label_noise must be in [0, 1], got {test_label_noise}")
    folder = raw_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    marker = {
        "generator": "poptorch_sim.datasets.mnist_standin",
        "version": STANDIN_VERSION,
        "seed": seed,
        "num_train": num_train,
        "num_test": num_test,
        "test_label_noise": test_label_noise,
        "variants": variants,
    }
    # The marker goes first: files without a marker would later be taken for real MNIST.
    (folder / STANDIN_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    gen = torch.Generator().manual_seed(seed)
    train_labels = torch.randint(10, (num_train,), generator=gen)
    test_labels = torch.randint(10, (num_test,), generator=gen)
    noisy_test = _noisy_labels(test_labels, test_label_noise, gen)
    splits = (("train", train_labels, train_labels, 1), ("t10k", test_labels, noisy_test, 2))
    for prefix, drawn, stored, offset in splits:
        images = render_split(drawn, seed=seed * 7919 + offset, variants=variants)
        _write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte", stored.to(torch.uint8))
    return folder


def _has_files(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MNIST_FILES)


def _standin_version(folder: Path) -> int | None:
    """The stand-in version recorded in ``folder``, or None when there is no marker."""
    try:
        return int(json.loads((folder / STANDIN_MARKER).read_text()).get("version", 0))
    except (OSError, ValueError, AttributeError):
        return None


def _network_reachable() -> bool:
    """Whether the download host answers within a few seconds (name lookup included)."""
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection(_DOWNLOAD_HOST, timeout=_NETWORK_TIMEOUT_S):
                result.append(True)
        except OSError:
            result.append(False)

    # getaddrinfo ignores socket timeouts, so a hung resolver is waited for in a daemon thread.
    thread = threading.Thread(target=probe, name="mnist-network-probe", daemon=True)
    thread.start()
    thread.join(_NETWORK_TIMEOUT_S + 1.0)
    return bool(result and result[0])


def _try_download(root: Path) -> bool:
    """Let torchvision download MNIST into ``root``; False (quickly) when it cannot."""
    if not _network_reachable():
        return False
    import torchvision

    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30.0)
    try:
        for train in (True, False):
            torchvision.datasets.MNIST(os.fspath(root), train=train, download=True)
    except Exception:  # noqa: BLE001 - any failure means "fall back to the stand-in"
        return False
    finally:
        socket.setdefaulttimeout(previous)
    return _has_files(raw_folder(root))


def ensure_mnist(
    root: str | os.PathLike[str] = "~/.torch/datasets",
    *,
    download: bool | None = None,
    seed: int = 0,
    verbose: bool = True,
) -> Source:
    """Make ``torchvision.datasets.MNIST(root, download=True)`` work, offline included.

    In order: keep real MNIST already under ``<root>/MNIST/raw``; else let torchvision
    download it; else generate the stand-in (:func:`write_standin`). A stand-in generated
    earlier is reused.

    Args:
        root: dataset root, as passed to ``torchvision.datasets.MNIST`` (default
            ``~/.torch/datasets``, where PopTorch's tutorials keep it).
        download: try the network; None (default) means yes unless ``POPTORCH_SIM_OFFLINE=1``.
        seed: stand-in seed (default 0).
        verbose: print one line saying which data is used (default True).

    Returns:
        ``"real"``, ``"downloaded"`` or ``"generated"``.

    >>> ensure_mnist("~/.torch/datasets")  # doctest: +SKIP
    'generated'
    """
    folder = raw_folder(root)
    version = _standin_version(folder)
    want_download = (not env.offline()) if download is None else download
    fresh = False
    if _has_files(folder) and version is None:
        source: Source = "real"
    elif _has_files(folder) and version == STANDIN_VERSION:
        source, fresh = "generated", False
    elif version is None and want_download and _try_download(folder.parent.parent):
        source = "downloaded"
    else:
        write_standin(folder.parent.parent, seed=seed)
        source, fresh = "generated", True
    if verbose:
        print(_describe(source, folder, fresh), flush=True)
    return source


def _describe(source: Source, folder: Path, fresh: bool) -> str:
    if source != "generated":
        return f"MNIST: using {source} MNIST in {folder}"
    why = "real MNIST not found and not downloaded; " if fresh else ""
    return (
        f"MNIST: {why}using the generated stand-in in {folder} "
        f"({IMAGE_SIZE}x{IMAGE_SIZE} synthetic digits; accuracies on it are not MNIST results)"
    )
