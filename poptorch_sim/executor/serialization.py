"""Executable files: what ``save`` writes and what ``loadExecutable`` and ``poptorch.load`` read.

A simulated executable is fully described by what compiled it: the inputs (their structure,
dtypes and shapes), the options, whether it trains, and optionally the model and optimizer.
Files are written with ``torch.save``; loading compiles again, which takes well under a second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import Error
from ..options import Options
from .inputs import BoundArgs

__all__ = ["FILE_VERSION", "SavedExecutable", "read", "write"]

FILE_VERSION = "3.4.0+sim"


def _target(filename: str) -> str:
    return os.path.join(filename, "model.poptorch") if os.path.isdir(filename) else filename


@dataclass(frozen=True)
class SavedExecutable:
    """What an executable file holds.

    Attributes:
        inputs: ``(args, kwargs)`` the executable was compiled for.
        options: its options; training: whether it trains.
        model, optimizer: the wrapped model and its optimizer (None with ``export_model=False``).
        rng_state: the model's ``rng_state`` at saving (None with ``save_rng_state=False``).
    """

    inputs: tuple[tuple[Any, ...], dict[str, Any]]
    options: Options
    training: bool
    model: Any
    optimizer: Any
    rng_state: list[int] | None


def write(
    filename: str,
    inputs: BoundArgs,
    options: Options,
    training: bool,
    model: Any,
    optimizer: Any,
    rng_state: list[int] | None,
) -> None:
    """Write an executable file (a directory gets ``model.poptorch`` inside it)."""
    data: dict[str, Any] = {
        "poptorch_sim_version": FILE_VERSION,
        "inputs": (inputs.args, inputs.kwargs),
        "options": options,
        "training": training,
        "model": model,
        "optimizer": optimizer,
        "rng_state": rng_state,
    }
    dirname = os.path.dirname(os.path.abspath(_target(filename)))
    os.makedirs(dirname, exist_ok=True)
    torch.save(data, _target(filename))


def read(filename: str, mismatch: type[Exception]) -> SavedExecutable:
    """Read an executable file.

    Args:
        filename: a file (or a directory holding ``model.poptorch``) written by ``write``.
        mismatch: what a file of another version raises: PopTorch's ``loadExecutable`` raises
            ``poptorch.Error``, its ``poptorch.load`` ``AssertionError``.

    Raises:
        Error: the file is not a poptorch_sim executable.
    """
    data = torch.load(_target(filename), weights_only=False)
    if not isinstance(data, dict) or "poptorch_sim_version" not in data:
        raise Error(f"Invalid file {filename}: not a poptorch_sim executable")
    version = data["poptorch_sim_version"]
    if version != FILE_VERSION:
        raise mismatch(
            f"Invalid file {filename}: PopTorch version mismatch: File was created with "
            f"version: {version} and this is version {FILE_VERSION}"
        )
    return SavedExecutable(
        inputs=data["inputs"],
        options=data["options"],
        training=data["training"],
        model=data["model"],
        optimizer=data["optimizer"],
        rng_state=_rng_list(data.get("rng_state")),
    )


def _rng_list(state: Any) -> list[int] | None:
    """A file's RNG state as ``rng_state`` takes it (older files hold torch's host state)."""
    if isinstance(state, torch.Tensor):
        return [torch.initial_seed(), *state.tolist()]
    return None if state is None else list(state)
