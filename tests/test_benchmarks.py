"""Every benchmark's quick mode runs to the end and prints at least one ratio.

The figures themselves are not checked (speed is never asserted in tests); this keeps the
scripts from rotting when the code under them changes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from in_process import run_script

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted(
    path.name
    for path in (REPO / "benchmarks").glob("*.py")
    if "--quick" in path.read_text() and path.name != "timing.py"
)
# Narrower quick runs where the whole quick mode takes minutes; the models themselves are tested
# against eager in tests/test_transformers_models.py and tests/test_real_models.py.
# scale_out.py: only its samples/s table, and of it the baseline and the two-process rows (each row
# is a launch: a launcher and its instances, each importing torch; the replicas-on-threads row
# between them runs the same launch and is tested in tests/test_replica_threads.py).
# first_calls.py: the sleeping pipeline's row (the model rows are models.py's).
# models.py: one row (BERT of 2 layers, one per IPU, pipelined training); every row runs the same
# `row` function, and each row compiles a transformers model (about a minute on a loaded two-core
# machine).
EXTRA_ARGS = {
    "first_calls.py": ["--only", "sleep", "--calls", "4"],
    "models.py": [
        *"--only bert --kinds train --strategies pipelined --no-model-ceilings".split(),
        *("--layers", "2"),
    ],
    "scale_out.py": ["--skip-sizes", "--rows", "1x1,2x2"],
}
RATIO = re.compile(r"\d+(\.\d+)?\s*[x×]|ratio[^:\n]*:\s*\d")


def test_every_benchmark_script_has_a_quick_mode() -> None:
    scripts = {p.name for p in (REPO / "benchmarks").glob("*.py")} - {"timing.py"}
    assert scripts - set(BENCHMARKS) == set()


def _run(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs benchmarks/``script`` with ``args`` from ``cwd``, the tree on its path, offline."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "POPTORCH_SIM_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("script", BENCHMARKS)
def test_quick_mode_runs_and_prints_ratios(
    script: str, tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In this process (tests/in_process.py): a subprocess would import torch again.
    status, stdout, stderr = run_script(
        REPO / "benchmarks" / script, "--quick", *EXTRA_ARGS.get(script, []),
        cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert status == 0, f"{script} --quick exited {status}:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    assert RATIO.search(stdout), f"{script} --quick printed no ratio:\n{stdout[-2000:]}"


def test_kernels_as_avx2_caps_poptorch_sim_torch_and_numpy(tmp_path: Path) -> None:
    # A subprocess: --as-avx2 replaces its process (torch and numpy read their caps on import).
    proc = _run("kernels.py", ["--quick", "--only", "short", "--as-avx2"], tmp_path)
    assert proc.returncode == 0, f"kernels.py --as-avx2 exited {proc.returncode}:\n{proc.stderr}"
    libraries, cpu = proc.stdout.splitlines()[:2]
    assert "torch CPU capability AVX512" not in libraries, libraries
    assert "AVX512" not in libraries.split("numpy")[1] and "X86_V4" not in libraries, libraries
    assert cpu.startswith("CPU: ") and "cap avx512" not in cpu, cpu
    assert RATIO.search(proc.stdout), proc.stdout[-2000:]
