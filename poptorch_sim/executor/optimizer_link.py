"""The user's optimizer as a training executor sees it: snapshot, ``setOptimizer``, device state.

The logic is the device side of training's (``training.py``: snapshots, the device trainer, the
optimizer-state reader); this class holds the fields it works on, so the executor only calls
its methods. See [Note: optimizer state on the device] in ``poptorch_sim/optim/base.py``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..optim import SGD
from ..options import Options
from .layout import Layout
from .training import DeviceTrainer, OptimizerMixin
from .weights import DeviceCopy

__all__ = ["OptimizerLink"]


class OptimizerLink(OptimizerMixin):
    """The optimizer of one training executor.

    Args:
        model: the user's model (the default optimizer steps its parameters).
        options: the executor's (frozen) options.
        optimizer: the user's optimizer; ``poptorch.optim.SGD(lr=0.01)`` when None.
    """

    def __init__(
        self, model: nn.Module, options: Options, optimizer: torch.optim.Optimizer | None
    ) -> None:
        self._options = options
        self._training = True
        self._executable: Any = None  # what has the device trainer, once compiled
        self._snapshot = None
        if optimizer is None:
            optimizer = SGD(model.parameters(), lr=0.01)
        self._optimizer = optimizer
        self._snapshot = self._take_snapshot(optimizer)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The user's optimizer (the latest given to ``setOptimizer``)."""
        return cast(torch.optim.Optimizer, self._optimizer)

    def build_trainer(self, device: DeviceCopy, layout: Layout) -> DeviceTrainer:
        """The device trainer of a freshly compiled executable."""
        return self._build_trainer(device, layout)

    def connect(self, executable: Any) -> None:
        """Read and write the optimizer state through ``executable.trainer`` from now on."""
        self._executable = executable
        self._connect_optimizer_state()

    def write_state_if_loaded(self) -> None:
        """Write a state loaded into the user's optimizer (``load_state_dict``) to the device."""
        if getattr(self._optimizer, "ipu_state_is_dirty", False):
            self._connect_optimizer_state()

    def after_run(self) -> None:
        """The device stepped: the host state is stale, and LR schedulers must not warn (the
        user's optimizer never steps on the host)."""
        self._optimizer._opt_called = True
        if hasattr(self._optimizer, "host_state_is_dirty"):
            self._optimizer.host_state_is_dirty = True

    def __getstate__(self) -> dict[str, Any]:
        """A pickled link (a pickled executor's) keeps the optimizer, not the executable."""
        return {**self.__dict__, "_executable": None}

    def release(self) -> None:
        """The executable is destroyed: keep the device state on the host, stop reading it."""
        if hasattr(self._optimizer, "_set_state_reader"):
            self._optimizer.state_dict()
            self._optimizer._set_state_reader(None)
        self._executable = None
