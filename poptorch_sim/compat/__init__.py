"""PopTorch's private modules that programs and PopTorch's own tests import.

``poptorch._impl`` (model wrapping helpers), ``poptorch._logging`` (the logger),
``poptorch._utils`` and ``poptorch._poplar_executor`` (helpers and the substitution hook that
PopTorch's add-on packages import) and ``poptorch.poptorch_core`` (names of PopTorch's C++
module). Each is registered under its PopTorch name in ``poptorch_sim`` (``poptorch_sim._impl``
...), which the ``poptorch`` alias module maps to ``poptorch._impl`` ..., so
``import poptorch._impl`` finds it.
"""

from __future__ import annotations

import sys

from . import _impl, _logging, _poplar_executor, _utils, poptorch_core

__all__ = ["_impl", "_logging", "_poplar_executor", "_utils", "poptorch_core"]

_PACKAGE = __name__.rpartition(".")[0]
for _module in (_impl, _logging, _poplar_executor, _utils, poptorch_core):
    sys.modules[f"{_PACKAGE}.{_module.__name__.rpartition('.')[2]}"] = _module
