"""``poptorch.optim``: torch optimizers with PopTorch's extra arguments, and LAMB.

What the device runs in their place (snapshots, ``setOptimizer``'s checks, the fused step, the
state under PopART's names) is the subpackage :mod:`.device`, not part of ``poptorch.optim``.
"""

from __future__ import annotations

from .adam import Adam, AdamW
from .attributes import VariableAttributes
from .base import Optimizer
from .lamb import LAMB
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["Optimizer", "VariableAttributes", "SGD", "Adam", "AdamW", "RMSprop", "LAMB"]
