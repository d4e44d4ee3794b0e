"""Compile a model offline on the ``meta`` device: reports of full-size models, nothing allocated.

See [Note: shapes-only models] in ``executor/meta.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .enums import ConnectionType
from .executor import PoplarExecutor, inferenceModel, trainingModel
from .options import Options

__all__ = ["compile_offline"]

ModelOrBuilder = nn.Module | Callable[[], nn.Module]
OptimizerOrBuilder = torch.optim.Optimizer | Callable[[Iterator[nn.Parameter]], Any]


def compile_offline(
    model: ModelOrBuilder,
    options: Options | None = None,
    *inputs: Any,
    optimizer: OptimizerOrBuilder | None = None,
    training: bool = True,
    **kwargs: Any,
) -> PoplarExecutor:
    """Build a model on the ``meta`` device and compile it offline, without running anything.

    The model is captured, split into stages and estimated exactly as at a first call; its
    reports (``poptorch_sim.memory_report``) are then ready. Nothing is allocated for its
    weights or activations, so BERT-Large with a full batch compiles in seconds on a laptop.
    The returned model cannot run (PopTorch's offline targets cannot either); ``destroy()`` it
    when done.

    Args:
        model: an ``nn.Module`` on the meta device, or a function of no arguments that builds
            one (called under ``with torch.device("meta"):``, so every parameter is meta).
        options: ``poptorch.Options`` (default: new ones). Unless they already compile offline
            (``useOfflineIpuTarget`` / ``ConnectionType.Never``), a copy of them is made offline
            with ``useOfflineIpuTarget()`` (IPU version 2); set your own for another version.
        *inputs: one call's positional inputs: tensors on the meta device (shapes only) or real
            tensors (taken as shapes), batched as the options say (``deviceIterations ×
            gradientAccumulation × replicas × micro-batch``).
        optimizer: for training, an optimizer of the model's parameters, or a function taking
            ``model.parameters()`` and returning one (default: PopTorch's SGD, ``lr=0.01``).
        training: ``trainingModel`` (default) or ``inferenceModel``.
        **kwargs: the call's keyword inputs.

    Returns:
        The compiled (offline) ``PoplarExecutor``.

    Raises:
        Error: the model has real (non-meta) parameters and ``inputs`` on the meta device, or
            anything a compile raises (a batch that does not split into micro-batches, ...).

    >>> import poptorch_sim as poptorch
    >>> def build():
    ...     return poptorch.BeginBlock(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()), ipu_id=0)
    >>> x = torch.empty(4, 1024, device="meta")
    >>> model = compile_offline(build, poptorch.Options(), x, training=False)
    >>> poptorch.memory_report(model).ipus[0].weights  # float32 1024 x 1024 + 1024
    4198400
    >>> model.destroy()
    """
    if not isinstance(model, nn.Module):
        with torch.device("meta"):
            model = model()
    opts = options if options is not None else Options()
    if opts.connection_type != ConnectionType.Never:
        opts = opts.clone().useOfflineIpuTarget()
    if not training:
        compiled = inferenceModel(model, opts)
    else:
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(model.parameters())
        compiled = trainingModel(model, opts, optimizer)
    compiled.compile(*inputs, **kwargs)
    return compiled
