"""``trainingModel``, ``inferenceModel`` and ``load``: the ways to get a ``PoplarExecutor``."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..enums import ConnectionType, OutputMode
from ..errors import Error
from ..options import Options, ShardedExecution
from . import serialization
from .executor import PoplarExecutor
from .weights import is_wrapped, owner_of

__all__ = ["inferenceModel", "load", "trainingModel"]

_INFERENCE_GA_ERROR = (
    "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its "
    "default value (1) when running a poptorch.inferenceModel()."
)
_PIPELINED_HINT = (
    " Use poptorch.Options().deviceIterations to process a sufficient number of batches each "
    "run for pipelined execution instead."
)


def _check_model(where: str, model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"poptorch.{where} expects a torch.nn.Module (or the PoplarExecutor of one) but got "
            f"{type(model).__name__} {model!r}: wrap it in a torch.nn.Module whose forward calls it"
        )


def trainingModel(
    model: nn.Module | PoplarExecutor,
    options: Options | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> PoplarExecutor:
    """Wrap ``model`` for training: each call runs ``deviceIterations`` optimizer steps.

    Args:
        model: the model; it must compute exactly one final loss (a torch loss or
            ``poptorch.identity_loss``). An executor is unwrapped to its model.
        options: defaults to ``poptorch.Options()``; frozen by this call.
        optimizer: defaults to ``poptorch.optim.SGD(model.parameters(), lr=0.01)``; its
            hyper-parameters are read now and again only at ``setOptimizer``.

    Returns:
        The executor; calling it returns the model's outputs per ``Options.outputMode``
        (default: the last micro-batch's).

    Raises:
        RuntimeError: the model is still wrapped by a training model (until ``destroy()``).
        TypeError: ``model`` is not an ``nn.Module``.

    >>> training = trainingModel(model, poptorch.Options(), optimizer)  # doctest: +SKIP
    """
    if isinstance(model, PoplarExecutor):
        model = model._user_model
    _check_model("trainingModel", model)
    # PopTorch checks the model's class: it stays wrapped until destroy(), even if the executor
    # that wrapped it has been dropped.
    if owner_of(model) is not None or is_wrapped(model):
        raise RuntimeError(
            "Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() "
            "on the model to unwrap before wrapping again."
        )
    return PoplarExecutor(model, _resolve_options(options, True), True, optimizer)


def inferenceModel(
    model: nn.Module | PoplarExecutor, options: Options | None = None
) -> PoplarExecutor:
    """Wrap ``model`` for inference: each call runs ``deviceIterations`` forward steps.

    The executor keeps its own copy of the weights. If ``model`` is also wrapped by a
    ``trainingModel`` (or is that executor), each call first picks up newly trained weights.

    Raises:
        Error: ``Training.gradientAccumulation`` is not 1.
        TypeError: ``model`` is not an ``nn.Module``.

    >>> inference = inferenceModel(model)  # doctest: +SKIP
    """
    if isinstance(model, PoplarExecutor):
        model = model._user_model
    _check_model("inferenceModel", model)
    if options is not None and isinstance(options, Options):
        if options.Training.gradient_accumulation != 1:
            message = _INFERENCE_GA_ERROR
            if not isinstance(options._execution_strategy, ShardedExecution):
                message += _PIPELINED_HINT
            raise Error(message)
    return PoplarExecutor(model, _resolve_options(options, False), training=False)


def load(filename: str, edit_opts_fn: Callable[[Options], None] | None = None) -> PoplarExecutor:
    """Rebuild the model saved in ``filename`` (with ``export_model=True``).

    Args:
        filename: a file written by ``save`` or ``compileAndExport``.
        edit_opts_fn: called with the saved (unfrozen) options before the model is rebuilt.

    Returns:
        A compiled ``trainingModel`` or ``inferenceModel``.

    Raises:
        AssertionError: wrong version, or the file holds no model (``export_model=False``).

    >>> inference = poptorch.load("model.poptorch")  # doctest: +SKIP
    """
    saved = serialization.read(filename, mismatch=AssertionError)
    if saved.model is None:
        raise AssertionError(
            f"The file {filename} contains no model (it was saved with export_model=False): "
            "create the trainingModel / inferenceModel wrapper for your model and call "
            "loadExecutable(filename) on it instead"
        )
    options = saved.options.clone()
    options.deleteIfExists("ipu_version")
    if options.connection_type == ConnectionType.Never:
        options.connectionType(ConnectionType.Always)
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    if saved.training:
        model = trainingModel(saved.model, options, saved.optimizer)
    else:
        model = inferenceModel(saved.model, options)
    model.loadExecutable(filename)
    if saved.rng_state is not None:
        model.rng_state = saved.rng_state
    return model


def _resolve_options(options: Options | None, training: bool) -> Options:
    """A frozen clone of ``options`` (frozen too), with the output mode's default resolved."""
    if options is None:
        options = Options()
    if not isinstance(options, Options):
        raise Error(
            f"Invalid type: 'options' is of type {type(options)} (Expected poptorch.Options)"
        )
    options._freeze()
    resolved = options.clone()
    if resolved.defaultOutputMode():
        resolved.outputMode(OutputMode.Final if training else OutputMode.All)
    resolved._freeze()
    return resolved
