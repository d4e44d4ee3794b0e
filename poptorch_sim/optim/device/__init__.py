"""The device optimizer: what PopTorch's IPU runs in place of the user optimizer's ``step()``.

PopTorch reads a user optimizer's hyper-parameters (``snapshot``) and runs its own update on the
device; ``setOptimizer`` takes a new snapshot (``check_update``). One training step, after the
``GA × R`` micro-batches of a device iteration (``DeviceTrainer.step``):

    all-reduce the gradients over processes          (``distributed``, when launched so)
    observe them for automatic loss scaling           (``loss_scaling``)
    unscale, clip, update params and state            (``fused``: one fused kernel call per
                                                       group; state on or off chip)

Algorithms the kernels do not cover run on a torch optimizer built from the snapshot
(``torch_optimizer``). The state reads and writes under PopART's names (``ipu_state``).

=====================  ==============================================================
module                 responsible for
=====================  ==============================================================
``snapshot``           the frozen hyper-parameters of a user optimizer
``attribute_checks``   attributes a later snapshot does not know (reported, ignored)
``replacement``        whether ``setOptimizer``'s snapshot may replace the compiled one
``reduction``          the mean-reduction strategy an accumulation dtype asks for
``hyperparameters``    the kinds the fused kernels run, their defaults and checks
``param_state``        per-parameter state that counts its own changes
``fused``              ``FusedOptimizer``: the step on the fused kernels
``torch_optimizer``    the torch optimizer fallback, and the groups both share
``loss_scaling``       automatic loss scaling (PopART's update rule)
``ipu_state``          the state under PopART's tensor names
``trainer``            ``DeviceTrainer``: one step of a compiled model, its state I/O
=====================  ==============================================================

The op wrappers these modules call are :mod:`poptorch_sim.kernels`' (``sgd_step_``,
``adam_step_``, ``grad_norm``, ``offload_stats``, ...); the executor's side (building the
trainer from the options, ``setOptimizer``) is :mod:`poptorch_sim.executor.training`.
"""

from __future__ import annotations

from .fused import FusedOptimizer
from .hyperparameters import KINDS
from .ipu_state import export_state, import_state
from .loss_scaling import FACTOR_NAME, FINAL_NAME, AutomaticLossScaling
from .param_state import ParamStateDict
from .reduction import RUNNING_NEEDS_RECOMPILE, apply_mean_reduction_strategy
from .replacement import check_update
from .snapshot import SUPPORTED_TYPES, GroupSnapshot, OptimizerSnapshot, snapshot
from .torch_optimizer import (
    apply_hyperparameters,
    device_groups,
    device_optimizer,
    prepare_gradients_,
    restore_groups_,
)
from .trainer import DeviceTrainer, read_state, write_state

__all__ = [
    "FACTOR_NAME",
    "FINAL_NAME",
    "KINDS",
    "RUNNING_NEEDS_RECOMPILE",
    "SUPPORTED_TYPES",
    "AutomaticLossScaling",
    "DeviceTrainer",
    "FusedOptimizer",
    "GroupSnapshot",
    "OptimizerSnapshot",
    "ParamStateDict",
    "apply_hyperparameters",
    "apply_mean_reduction_strategy",
    "check_update",
    "device_groups",
    "device_optimizer",
    "export_state",
    "import_state",
    "prepare_gradients_",
    "read_state",
    "restore_groups_",
    "snapshot",
    "write_state",
]
