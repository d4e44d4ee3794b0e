"""The user's optimizer as a training executor sees it: snapshot, ``setOptimizer``, device state.

It holds the optimizer, its latest snapshot and the executable, and calls the functions of
``training.py`` (snapshots, the device trainer, the optimizer-state reader) with them, so the
executor only calls its methods. See [Note: optimizer state on the device] in ``poptorch_sim/optim/base.py``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..optim import SGD
from ..optim.device import OptimizerSnapshot, check_update
from ..options import Options
from .layout import Layout
from .training import DeviceTrainer, build_trainer, connect_state, take_snapshot
from .weights import DeviceCopy

__all__ = ["OptimizerLink"]


class OptimizerLink:
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
        self._executable: Any = None  # what has the device trainer, once compiled
        self._reported: set[str] = set()  # "Ignoring unexpected ..." messages given
        if optimizer is None:
            optimizer = SGD(model.parameters(), lr=0.01)
        self._optimizer: Any = optimizer
        self._snapshot: OptimizerSnapshot = take_snapshot(options, optimizer)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The user's optimizer (the latest given to ``setOptimizer``)."""
        return cast(torch.optim.Optimizer, self._optimizer)

    def build_trainer(self, device: DeviceCopy, layout: Layout) -> DeviceTrainer:
        """The device trainer of a freshly compiled executable."""
        return build_trainer(self._options, self._optimizer, self._snapshot, device, layout)

    def connect(self, executable: Any) -> None:
        """Read and write the optimizer state through ``executable.trainer`` from now on."""
        self._executable = executable
        connect_state(self._options, self._optimizer, executable)

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Use ``optimizer``'s current hyper-parameters (and state, if loaded) from now on.

        Raises:
            Error: after compilation, a constant hyper-parameter changed.
        """
        compiled = self._executable is not None
        previous = self._snapshot if compiled else None
        new = take_snapshot(self._options, optimizer, previous, self._reported)
        if previous is not None:
            check_update(previous, new)
        self._snapshot = new
        old = self._optimizer
        if old is not optimizer and hasattr(old, "_set_state_reader"):
            if compiled:
                old.state_dict()
            old._set_state_reader(None)
        self._optimizer = optimizer
        if compiled and self._executable.trainer is not None:
            self._executable.trainer.apply(self._snapshot)
            connect_state(self._options, optimizer, self._executable)

    def write_state_if_loaded(self) -> None:
        """Write a state loaded into the user's optimizer (``load_state_dict``) to the device."""
        if getattr(self._optimizer, "ipu_state_is_dirty", False):
            connect_state(self._options, self._optimizer, self._executable)

    def read_state_for_detach(self) -> None:
        """Read the device state into the user's optimizer; it is written back at attach."""
        opt = self._optimizer
        if self._executable is None or not hasattr(opt, "_set_state_reader"):
            return
        opt.state_dict()
        if opt.has_state():
            opt.ipu_state_is_dirty = True

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
