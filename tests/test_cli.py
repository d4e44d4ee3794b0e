"""The paths of the commands and of PopTorch's private modules (``poptorch_sim/cli``, ``compat``).

Each command runs as ``python -m`` in its feature's tests: ``python -m poptorch_sim`` in
``test_api.py``, ``.shard`` in ``test_sharding.py``, ``.poprun`` in ``test_distributed.py``,
``.memory`` in ``test_memory.py``; ``.datasets`` here, in this process, found and run as
``python -m`` finds and runs it (``runpy``).
"""

from __future__ import annotations

import importlib
import runpy
import sys

import pytest

import poptorch_sim


def test_datasets_command_answers_at_its_documented_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The other commands run as subprocesses in their features' tests.
    monkeypatch.setattr(sys, "argv", ["-m", "--help"])
    monkeypatch.delitem(sys.modules, "poptorch_sim.datasets.__main__", raising=False)
    with pytest.raises(SystemExit) as done:
        runpy.run_module("poptorch_sim.datasets", run_name="__main__", alter_sys=True)
    assert done.value.code == 0
    assert "python -m poptorch_sim.datasets" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["_impl", "_logging", "poptorch_core"])
def test_poptorch_private_modules_are_the_compat_modules(name: str) -> None:
    module = importlib.import_module(f"poptorch.{name}")
    assert module is importlib.import_module(f"poptorch_sim.compat.{name}")
    assert module is getattr(poptorch_sim, name)
