"""Programs run as ``python script.py`` or ``python -m module`` runs them, but in the test's
process: a child process would import torch (and transformers) again, seconds of CPU each.

What a program may change for the rest of the process is put back afterwards: the environment,
``sys.argv``, ``sys.path``, the working folder, torch's intra-op threads and random state and
poptorch_sim's log level. Modules it imported from ``benchmarks/`` or ``tutorials/`` (the
benchmarks' ``timing``, the packing tutorial's ``packed_bert``, ...) are dropped, so that each
run imports its own.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from poptorch_sim.logger import logger

REPO = Path(__file__).resolve().parent.parent
LOCAL_MODULES = (REPO / "benchmarks", REPO / "tutorials")


def run_script(
    script: Path,
    *args: str,
    cwd: Path,
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """``python script *args`` from ``cwd``, offline, with ``env`` added to the environment:
    its exit status, standard output and standard error (its child processes' too)."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", [str(script.parent), *sys.path])  # as `python script.py`
    return _run(
        lambda: runpy.run_path(str(script), run_name="__main__"),
        [str(script), *args],
        capfd,
        monkeypatch,
        env,
    )


def run_module(
    module: str,
    *args: str,
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """``python -m module *args``, offline, with ``env`` added to the environment: its exit
    status, standard output and standard error."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # a program it runs puts its folder first
    monkeypatch.delitem(sys.modules, f"{module}.__main__", raising=False)
    return _run(
        lambda: runpy.run_module(module, run_name="__main__", alter_sys=True),
        [module, *args],
        capfd,
        monkeypatch,
        env,
    )


def _run(
    run: Callable[[], object],
    argv: list[str],
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str] | None,
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", argv)
    environ = dict(os.environ)
    threads, rng, level = torch.get_num_threads(), torch.get_rng_state(), logger.level
    modules = set(sys.modules)
    os.environ.update({"POPTORCH_SIM_OFFLINE": "1", **(env or {})})
    capfd.readouterr()
    status = 0
    try:
        run()
    except SystemExit as exit:
        # As the interpreter exits: None is 0, a message is 1.
        status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
        logger.setLevel(level)
        for name in set(sys.modules) - modules:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if any(Path(origin).is_relative_to(folder) for folder in LOCAL_MODULES):
                del sys.modules[name]
    out, err = capfd.readouterr()
    return status, out, err
