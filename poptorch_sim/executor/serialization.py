"""Saving and loading executables: ``save``, ``compileAndExport``, ``loadExecutable``, ``load``.

A simulated executable is fully described by what compiled it: the inputs (their structure,
dtypes and shapes), the options, whether it trains, and optionally the model and optimizer.
Files are written with ``torch.save``; loading compiles again, which takes well under a second.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ..enums import ConnectionType
from ..errors import NO_EXECUTABLE_ERR, Error

__all__ = ["SerializationMixin", "load", "FILE_VERSION"]

FILE_VERSION = "3.4.0+sim"


def _target(filename: str) -> str:
    return os.path.join(filename, "model.poptorch") if os.path.isdir(filename) else filename


def _read(filename: str) -> dict[str, Any]:
    data = torch.load(_target(filename), weights_only=False)
    if not isinstance(data, dict) or "poptorch_sim_version" not in data:
        raise Error(f"Invalid file {filename}: not a poptorch_sim executable")
    return data


def _check_version(filename: str, data: dict[str, Any]) -> str | None:
    version = data["poptorch_sim_version"]
    if version != FILE_VERSION:
        return (
            f"Invalid file {filename}: PopTorch version mismatch: File was created with "
            f"version: {version} and this is version {FILE_VERSION}"
        )
    return None


class SerializationMixin:
    """``save``/``compileAndExport``/``loadExecutable`` of ``PoplarExecutor``."""

    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Save the executable (and by default the model and optimizer) to ``filename``.

        A directory gets ``model.poptorch`` inside it.

        Raises:
            Error: the model has not been compiled.
        """
        exe = self._executable  # type: ignore[attr-defined]
        if exe is None:
            raise Error(NO_EXECUTABLE_ERR)
        if self._training:  # type: ignore[attr-defined]
            self.copyWeightsToHostIfNeeded()  # type: ignore[attr-defined]
        data: dict[str, Any] = {
            "poptorch_sim_version": FILE_VERSION,
            "inputs": (exe.inputs.args, exe.inputs.kwargs),
            "options": self._options,  # type: ignore[attr-defined]
            "training": self._training,  # type: ignore[attr-defined]
            "model": self.model if export_model else None,  # type: ignore[attr-defined]
            "optimizer": self._optimizer if export_model else None,  # type: ignore[attr-defined]
            "rng_state": torch.get_rng_state() if save_rng_state else None,
        }
        dirname = os.path.dirname(os.path.abspath(_target(filename)))
        os.makedirs(dirname, exist_ok=True)
        torch.save(data, _target(filename))

    def compileAndExport(
        self, filename: str, *args: Any, export_model: bool = True, **kwargs: Any
    ) -> None:
        """``compile(*args, **kwargs)`` then ``save(filename, export_model)``."""
        self.compile(*args, **kwargs)  # type: ignore[attr-defined]
        self.save(filename, export_model)

    def loadExecutable(self, filename: str) -> None:
        """Load an executable saved with ``export_model=False`` into this wrapper."""
        data = _read(filename)
        problem = _check_version(filename, data)
        if problem:
            raise Error(problem)
        args, kwargs = data["inputs"]
        if self._executable is not None:  # type: ignore[attr-defined]
            self.destroy()  # type: ignore[attr-defined]
        self.compile(*args, **kwargs)  # type: ignore[attr-defined]
        if data.get("rng_state") is not None:
            torch.set_rng_state(data["rng_state"])


def load(filename: str, edit_opts_fn: Callable[[Any], None] | None = None) -> Any:
    """Rebuild the model saved in ``filename`` (with ``export_model=True``).

    Args:
        filename: a file written by ``save`` or ``compileAndExport``.
        edit_opts_fn: called with the saved (unfrozen) options before the model is rebuilt.

    Returns:
        A compiled ``trainingModel`` or ``inferenceModel``.

    Raises:
        AssertionError: wrong version, or the file holds no model (``export_model=False``).
    """
    from .wrap import inferenceModel, trainingModel

    data = _read(filename)
    problem = _check_version(filename, data)
    if problem:
        raise AssertionError(problem)
    if data["model"] is None:
        raise AssertionError(
            f"The file {filename} contains no model (it was saved with export_model=False): "
            "create the trainingModel / inferenceModel wrapper for your model and call "
            "loadExecutable(filename) on it instead"
        )
    options = data["options"].clone()
    options.deleteIfExists("ipu_version")
    if options.connection_type == ConnectionType.Never:
        options.connectionType(ConnectionType.Always)
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    if data["training"]:
        model = trainingModel(data["model"], options, data["optimizer"])
    else:
        model = inferenceModel(data["model"], options)
    model.loadExecutable(filename)
    return model
