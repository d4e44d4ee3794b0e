"""``poptorch``: an alias of poptorch_sim, so unmodified PopTorch programs ``import poptorch``.

The module *is* poptorch_sim (``poptorch is poptorch_sim``), and every ``poptorch.<sub>`` module
is the matching ``poptorch_sim.<sub>`` module object, so state is never duplicated.
"""

import importlib
import importlib.abc
import importlib.util
import sys

import poptorch_sim


def _real_name(fullname):
    return "poptorch_sim." + fullname[len("poptorch.") :]


class _AliasLoader(importlib.abc.Loader):
    """Loads ``poptorch.X`` as the module object ``poptorch_sim.X``.

    One loader per name, so the legacy ``spec.loader.load_module()`` (no argument), which
    PopTorch's add-on packages call, knows which module it loads.
    """

    def __init__(self, fullname):
        self.name = fullname

    def create_module(self, spec):  # noqa: D102
        return importlib.import_module(_real_name(spec.name))

    def exec_module(self, module):  # noqa: D102
        sys.modules[self.name] = module

    def load_module(self, fullname=None):  # noqa: D102
        module = importlib.import_module(_real_name(fullname or self.name))
        sys.modules[fullname or self.name] = module
        return module


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``poptorch.X`` to the already-importable ``poptorch_sim.X``."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102
        if not fullname.startswith("poptorch."):
            return None
        if importlib.util.find_spec(_real_name(fullname)) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname))


if not any(type(f).__name__ == "_AliasFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
sys.modules[__name__] = poptorch_sim
