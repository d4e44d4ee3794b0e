"""Sorting a model-garden failure into the party that must fix it.

    poptorch_sim   the simulator lacks or breaks a PopTorch/PopART name or behaviour
    environment    a package that did not install or does not work on this Python, a download,
                   a data set or compiled custom op that is not there, an SDK tool, a time limit
    app            the application's own code against today's libraries (torch 2, Python 3.11)

The rules read the failure's text (message and traceback): the names the simulator must
provide first, then the environment's signatures, then where the innermost frame is.
"""

from __future__ import annotations

import re

__all__ = ["CLASSES", "classify"]

CLASSES = ("poptorch_sim", "environment", "app")

_SIM_NAMES = re.compile(
    r"module '(poptorch|popart|poptorch_sim)[\w.]*' has no attribute"
    r"|'_OpNamespace' 'poptorch' object has no attribute"
    r"|No module named '(poptorch|popart|poptorch_sim)[\w.]*'"
)
_ENVIRONMENT = re.compile(
    r"No module named '(?!poptorch|popart)"
    r"|URLError|ConnectionError|ConnectTimeout|Name or service not known"
    r"|Temporary failure in name resolution|Max retries exceeded|HTTPError|ReadTimeout"
    r"|OfflineModeIsEnabled|couldn't connect to|LocalEntryNotFoundError|Network is unreachable"
    r"|FileNotFoundError|No such file or directory|cannot open shared object file"
    r"|custom_ops\.so|load_lib|poprun|mpirun|gc-monitor|gcipuinfo|libpvti"
    r"|PackageNotFoundError|DistributionNotFound|timed out after"
    r"|was removed in the NumPy 2.0 release|pkg_resources"
)
# A traceback frame as Python prints it, or as pytest's short tracebacks do.
_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\w+)|^(\S+\.py):\d+: in (\S+)', re.M)
# Simulator frames that only pass a call through: loss recorders' TorchFunctionModes and the
# precision wrapper's forward (a torch error under them is the model's own).
_PASS_THROUGH = ("__torch_function__", "precision.py:forward")
_SIM_PATHS = ("/poptorch_sim/", "/poptorch/", "/popart/")


def classify(text: str, project_root: str) -> str:
    """The class of the failure whose message and traceback are ``text``.

    Args:
        text: the failure's text (pytest's failure message and traceback, or a log's tail).
        project_root: the simulator's checkout (frames under it are the simulator's).

    Returns:
        One of ``CLASSES``.

    >>> classify("AttributeError: module 'popart' has no attribute 'X'", "/p")
    'poptorch_sim'
    """
    if _SIM_NAMES.search(text):
        return "poptorch_sim"
    if _ENVIRONMENT.search(text):
        return "environment"
    frames = [
        path.replace("\\", "/")
        for path, function in ((m[0] or m[2], m[1] or m[3]) for m in _FRAME.findall(text))
        if not (
            (function in _PASS_THROUGH or f"{path.rsplit('/', 1)[-1]}:{function}" in _PASS_THROUGH)
            and any(p in path for p in _SIM_PATHS)
        )
        and "/torch/" not in path.replace("\\", "/")
    ]
    if frames and frames[-1].startswith(project_root) and any(p in frames[-1] for p in _SIM_PATHS):
        return "poptorch_sim"
    if frames and "/site-packages/" in frames[-1]:
        return "environment"  # an installed package (a pin) that does not work here
    return "app"
