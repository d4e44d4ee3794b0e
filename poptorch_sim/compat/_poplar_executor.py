"""PopTorch's private ``poptorch._poplar_executor`` module, which PopTorch's add-on packages import.

``poptorch_geometric`` loads it by path (``importlib.util.find_spec(...).loader.load_module()``,
which executes this file again in the existing module) to register its substitution manager
with ``_OverwriteContextManager``; the class lives in ``overwrite.py`` so that a second execution
of this file finds the same class and the same registrations.
"""

from __future__ import annotations

from ..executor import PoplarExecutor
from ..executor.hooks import registerPostCompileHook, registerPreCompileHook
from .overwrite import _OverwriteContextManager

__all__ = [
    "PoplarExecutor",
    "_OverwriteContextManager",
    "registerPostCompileHook",
    "registerPreCompileHook",
]
