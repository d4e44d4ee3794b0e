"""The paths of the commands and of PopTorch's private modules (``poptorch_sim/cli``, ``compat``).

Each command runs as ``python -m`` in its feature's tests: ``python -m poptorch_sim`` in
``test_api.py``, ``.shard`` in ``test_sharding.py``, ``.poprun`` in ``test_distributed.py``,
``.memory`` in ``test_memory.py``; ``.datasets`` here.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import poptorch_sim

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_datasets_command_answers_at_its_documented_path() -> None:
    # The other commands run as subprocesses in their features' tests.
    proc = _run("-m", "poptorch_sim.datasets", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "python -m poptorch_sim.datasets" in proc.stdout


@pytest.mark.parametrize("name", ["_impl", "_logging", "poptorch_core"])
def test_poptorch_private_modules_are_the_compat_modules(name: str) -> None:
    module = importlib.import_module(f"poptorch.{name}")
    assert module is importlib.import_module(f"poptorch_sim.compat.{name}")
    assert module is getattr(poptorch_sim, name)
