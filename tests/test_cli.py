"""The paths of the commands and of PopTorch's private modules (``poptorch_sim/cli``, ``compat``).

Each command runs as ``python -m`` in its feature's tests: ``python -m poptorch_sim`` in
``test_api.py``, ``.shard`` in ``test_sharding.py``, ``.poprun`` in ``test_distributed.py``,
``.memory`` in ``test_memory.py``; ``.datasets`` here, in this process, found and run as
``python -m`` finds and runs it (``tests/in_process.py``).
"""

from __future__ import annotations

import importlib

import pytest
from in_process import run_module

import poptorch_sim


def test_datasets_command_answers_at_its_documented_path(
    capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, out, err = run_module(
        "poptorch_sim.datasets", "--help", capfd=capfd, monkeypatch=monkeypatch
    )
    assert status == 0, err[-2000:]
    assert "python -m poptorch_sim.datasets" in out


@pytest.mark.parametrize("name", ["_impl", "_logging", "poptorch_core"])
def test_poptorch_private_modules_are_the_compat_modules(name: str) -> None:
    module = importlib.import_module(f"poptorch.{name}")
    assert module is importlib.import_module(f"poptorch_sim.compat.{name}")
    assert module is getattr(poptorch_sim, name)
