"""``poptorch.optim``: torch optimizers with PopTorch's extra arguments, and LAMB.

The executor-facing machinery lives in submodules and is not part of ``poptorch.optim``:
``snapshot`` (``snapshot``, ``OptimizerSnapshot``), ``replacement`` (``check_update``) and
``device`` (``device_optimizer``, ``apply_hyperparameters``, ``prepare_gradients_``).
"""

from __future__ import annotations

from .adam import Adam, AdamW
from .attributes import VariableAttributes
from .base import Optimizer
from .lamb import LAMB
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["Optimizer", "VariableAttributes", "SGD", "Adam", "AdamW", "RMSprop", "LAMB"]
