"""The second pass: each failing test run again with the environment's obstacles removed.

A test's first error may be the environment's (torch 2.14, Python 3.11, a log line PopART would
print) and hide what poptorch_sim computes after it. The second pass runs the failed cases of a
file again in a patched copy of ``tests/`` under the output folder, with the plugin
``obstacles.py`` loaded and ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``; each case is then classed by
what fails *after* the obstacles. PopTorch's own files are never changed.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

__all__ = ["OBSTACLES", "ENV", "PLUGIN", "node_id", "prepare_copy"]

# The obstacles, as the report lists them.
OBSTACLES = (
    "the old `Sampler(data_source)` signature restored",
    "log and IR assertions (`helpers.LogChecker`, `LogIterator`) made to pass",
    "`torch.load(weights_only=False)` (`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`)",
    "Python >= 3.10's `SyntaxError` wording accepted",
)
ENV = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
PLUGIN = "benchmarks.poptorch_tests.obstacles"

# Text edits of the copy: (file, pattern, replacement). Python 3.8's wording of an unclosed
# parenthesis, split over two string literals, becomes the wording Python >= 3.10 prints.
_EDITS = (
    (
        "options_test.py",
        r"unexpected EOF \"\s*\\\s*\n\s*\"while parsing\\n\"",
        "'(' was never closed\\\\n\"",
    ),
)


def prepare_copy(checkout: Path, out: Path) -> Path:
    """A copy of ``checkout`` for the second pass, made once under ``out``: ``tests/`` copied
    and edited, every other top-level entry a link to the original.

    Returns:
        The copy's ``tests/`` folder.
    """
    root = out / "obstacles_removed"
    tests = root / "tests"
    if tests.exists():
        return tests
    root.mkdir(parents=True, exist_ok=True)
    for entry in checkout.resolve().iterdir():
        if entry.name != "tests":
            (root / entry.name).symlink_to(entry)
    shutil.copytree(checkout / "tests", tests, ignore=shutil.ignore_patterns("__pycache__"))
    for name, pattern, replacement in _EDITS:
        path = tests / name
        if path.exists():
            text, count = re.subn(pattern, replacement, path.read_text())
            if count == 0:
                raise RuntimeError(f"{path}: the edit {pattern!r} found nothing to replace")
            path.write_text(text)
    return tests


def node_id(file: str, case_name: str) -> str:
    """The pytest node id of ``case_name`` (``classname::name`` as read from the junit XML)
    in ``file``, a path relative to ``tests/``."""
    classname, _, name = case_name.partition("::")
    module = file.removesuffix(".py").replace("/", ".")
    # The classname is the module's dotted path (``tests.`` first when tests/ is a package)
    # and then the test's classes.
    head, found, rest = ("." + classname + ".").partition("." + module + ".")
    classes = [part for part in rest.split(".") if part] if found else []
    return "::".join([file, *classes, name])
