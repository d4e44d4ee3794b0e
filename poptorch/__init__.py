"""``poptorch``: an alias of poptorch_sim, so unmodified PopTorch programs ``import poptorch``.

The module *is* poptorch_sim (``poptorch is poptorch_sim``), and every ``poptorch.<sub>`` module
is the matching ``poptorch_sim.<sub>`` module object, so state is never duplicated.
"""

import importlib
import importlib.abc
import importlib.util
import sys

import poptorch_sim


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``poptorch.X`` to the already-importable ``poptorch_sim.X``."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        if not fullname.startswith("poptorch."):
            return None
        real = "poptorch_sim." + fullname[len("poptorch.") :]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # noqa: D102
        real = "poptorch_sim." + spec.name[len("poptorch.") :]
        return importlib.import_module(real)

    def exec_module(self, module):  # noqa: D102
        sys.modules[module.__spec__.name] = module


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
sys.modules[__name__] = poptorch_sim
