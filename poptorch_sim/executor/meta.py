"""Models on the ``meta`` device (shapes only): compiled offline for their reports, never run.

[Note: shapes-only models]
A model built under ``with torch.device("meta"):`` has parameters with shapes and dtypes but no
data, so a full-size configuration (BERT-Large, ResNet-50) costs no host memory. Compiling it
offline (``opts.useOfflineIpuTarget()`` or ``connectionType(ConnectionType.Never)``) does what
any compile does (capture, split into stages, the memory estimate), with the stages' "devices"
being ``meta``: nothing is allocated, no stage runs. Inputs may be on the ``meta`` device too,
or real (they are then taken as shapes). PopTorch's offline targets compile and refuse to run
(``AssertionError: Trying to attach to an offline device``); so does a meta model. One that is
not compiled offline is refused at compile, with the fix.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..enums import ConnectionType
from ..errors import Error
from .inputs import BoundArgs

__all__ = ["META_DEVICE", "check_meta", "is_meta", "meta_devices", "on_meta"]

META_DEVICE = torch.device("meta")


def is_meta(model: nn.Module) -> bool:
    """Whether ``model`` has a parameter or buffer on the ``meta`` device."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def meta_devices(model: nn.Module, ipus: list[int]) -> dict[int, torch.device] | None:
    """``{ipu: meta}`` for a shapes-only model (its stages never leave the meta device), else
    None (the runtime's default devices)."""
    return dict.fromkeys(ipus, META_DEVICE) if is_meta(model) else None


def check_meta(model: nn.Module, bound: BoundArgs, options: Any) -> bool:
    """Whether this compile is of a shapes-only model; refuse the ones that cannot compile.

    Raises:
        Error: a meta model that is not compiled offline, or meta inputs for a real model.
    """
    meta_inputs = [t for t in bound.tensors() if t.is_meta]
    if not is_meta(model):
        if meta_inputs:
            raise Error(
                f"inputs on the meta device (shapes only, e.g. {tuple(meta_inputs[0].shape)}) "
                "need a model on the meta device too: build it under `with "
                'torch.device("meta"):` and compile it offline (opts.useOfflineIpuTarget())'
            )
        return False
    if options.connection_type != ConnectionType.Never:
        raise Error(
            "The model has parameters on the meta device (shapes only): it can be compiled "
            "offline but not run. Use opts.useOfflineIpuTarget() (or "
            "opts.connectionType(poptorch.ConnectionType.Never)) and model.compile(inputs) to "
            "get its reports, or build the model on a real device to run it "
            f"(connection type: {ConnectionType(options.connection_type).name})"
        )
    return True


def on_meta(bound: BoundArgs) -> BoundArgs:
    """The inputs as shapes: every tensor moved to the meta device (no copy of data)."""
    return bound.map_tensors(lambda t: t if t.is_meta else t.to(META_DEVICE))
