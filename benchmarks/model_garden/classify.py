"""Sorting a model-garden failure into the party that must fix it.

    poptorch_sim   the simulator lacks or breaks a PopTorch/PopART name or behaviour, its numbers
                   differ from the CPU's in a test that compares them, or the run hung or ran
                   out of time with no other reason shown
    environment    a package that did not install or does not work on this Python, a download,
                   a data set or compiled custom op that is not there, an SDK tool
    app            the application's own code against today's libraries (torch 2, Python 3.11)

The rules read the failure's text (message and traceback): the names the simulator must
provide first, then the environment's signatures, then a hang or a time limit, then where the
innermost frame is.

[Note: a hang is the simulator's] A program that trains on IPUs in minutes must not hang here,
so a run stopped at a time limit (the runner's, or pytest-timeout's) is poptorch_sim's unless its
text shows a download that failed or stalled. A missing file or package in the same log is no
reason: the hang came after it. Classing hangs "environment" hid the asynchronous loader's
deadlock.
"""

from __future__ import annotations

import os
import re

__all__ = ["CLASSES", "TIMED_OUT", "classify"]

CLASSES = ("poptorch_sim", "environment", "app")

# The marker the runner appends to a log it stopped (garden._run).
TIMED_OUT = "[model_garden] timed out after"

_SIM_NAMES = re.compile(
    r"module '(poptorch|popart|poptorch_sim)[\w.]*' has no attribute"
    r"|'_OpNamespace' 'poptorch' object has no attribute"
    r"|No module named '(poptorch|popart|poptorch_sim)[\w.]*'"
)
# A download that failed or stalled: also a reason for a run that ran out of time.
_NETWORK = (
    r"URLError|ConnectionError|ConnectTimeout|Name or service not known"
    r"|Temporary failure in name resolution|Max retries exceeded|HTTPError|ReadTimeout"
    r"|OfflineModeIsEnabled|couldn't connect to|LocalEntryNotFoundError|Network is unreachable"
)
_ENVIRONMENT = re.compile(
    r"No module named '(?!poptorch|popart)|"
    + _NETWORK
    + r"|FileNotFoundError|No such file or directory|cannot open shared object file"
    r"|custom_ops\.so|load_lib|poprun|mpirun|gc-monitor|gcipuinfo|libpvti"
    r"|PackageNotFoundError|DistributionNotFound"
    r"|was removed in the NumPy 2.0 release|pkg_resources"
    # cnns' sample images (data/images), which its get_images.sh downloads, are not there
    r"|No images found\. Run get_images\.sh"
    # a fixture of a conftest the runner switched off (cnns: it downloads data sets at start)
    r"|fixture '\w+' not found"
)
# A run stopped for time: the runner's marker, or pytest-timeout's report of one test.
_HANG = re.compile(re.escape(TIMED_OUT) + r"|Failed: Timeout >|\+{5,} Timeout \+{5,}")
# A numerical comparison that failed: the apps' tests compare the IPU run with the CPU's (eager
# PyTorch, the oracle), so a mismatch is the simulator's whatever frame the assertion is in.
_MISMATCH = re.compile(
    r"allclose|assert_close|Tensor-likes are not close|Arrays are not (almost )?equal"
    r"|Not equal to tolerance"
)
# A traceback frame as Python prints it, or as pytest's short tracebacks do.
_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\w+)|^(\S+\.py):\d+: in (\S+)', re.M)
# Simulator frames that only pass a call through: loss recorders' TorchFunctionModes and the
# precision wrapper's forward (a torch error under them is the model's own).
_PASS_THROUGH = ("__torch_function__", "precision.py:forward")
_SIM_PATHS = ("/poptorch_sim/", "/poptorch/", "/popart/")


def _frames(text: str, cwd: str | None) -> list[str]:
    """The traceback's frame paths, innermost last, without torch's and pass-through frames.

    A relative path (pytest prints frames relative to where it ran) is made absolute against
    ``cwd``; with no ``cwd`` it is kept, as ``./path``."""
    frames = []
    for m in _FRAME.findall(text):
        path, function = (m[0] or m[2]).replace("\\", "/"), m[1] or m[3]
        if not path.startswith("/"):
            path = os.path.normpath(os.path.join(cwd, path)) if cwd else "./" + path
        short = f"{path.rsplit('/', 1)[-1]}:{function}"
        passes = function in _PASS_THROUGH or short in _PASS_THROUGH
        if (passes and any(p in path for p in _SIM_PATHS)) or "/torch/" in path:
            continue
        frames.append(path)
    return frames


def _in_project(path: str, project_root: str) -> bool:
    """Whether ``path`` is a simulator file of the checkout at ``project_root``; a relative
    path read with no folder to resolve it (``./...``) is, when it names a simulator folder
    outside an installed package's."""
    if not any(p in path.replace("./", "/", 1) for p in _SIM_PATHS):
        return False
    if path.startswith("./"):
        return "/site-packages/" not in path and "/dist-packages/" not in path
    return path.startswith(project_root.rstrip("/") + "/")


def classify(text: str, project_root: str, cwd: str | None = None) -> str:
    """The class of the failure whose message and traceback are ``text``.

    Args:
        text: the failure's text (pytest's failure message and traceback, or a log's tail).
        project_root: the simulator's checkout (frames under it are the simulator's).
        cwd: the folder the failing command ran in (relative frames are read against it).

    Returns:
        One of ``CLASSES``.

    >>> classify("AttributeError: module 'popart' has no attribute 'X'", "/p")
    'poptorch_sim'
    """
    if _SIM_NAMES.search(text):
        return "poptorch_sim"
    if _HANG.search(text):  # see [Note: a hang is the simulator's]
        return "environment" if re.search(_NETWORK, text) else "poptorch_sim"
    if _ENVIRONMENT.search(text):
        return "environment"
    if "AssertionError" in text and _MISMATCH.search(text):
        return "poptorch_sim"
    frames = _frames(text, cwd)
    if frames and _in_project(frames[-1], project_root):
        return "poptorch_sim"
    if frames and ("/site-packages/" in frames[-1] or "/dist-packages/" in frames[-1]):
        return "environment"  # an installed package (a pin) that does not work here
    return "app"
