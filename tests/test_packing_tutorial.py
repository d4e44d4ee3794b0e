"""The packing tutorial runs end to end (tiny sizes) and its three modes give the same answers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
TUTORIAL = REPO / "tutorials" / "packing" / "packed_bert.py"
TINY = [
    "--num-samples", "48", "--max-seq-len", "32", "--mean-len", "16", "--batch-size", "4",
    "--max-sequences-per-pack", "4", "--hidden-size", "32", "--layers", "1", "--producers", "3",
]  # fmt: skip


def test_packing_tutorial_runs_and_packing_changes_no_answer(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "POPTORCH_SIM_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(TUTORIAL), *TINY],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "48 requests, mean length" in out
    for mode in ("padded", "packed offline", "packed online"):
        assert re.search(rf"^{mode}\s+[\d.]+\s+[\d.]+x\s+[\d.]+$", out, re.M), out
    differences = re.findall(r"mean \|difference\| of outputs, .* vs .*: (\S+)", out)
    assert len(differences) == 3, out
    assert all(float(d) < 1e-5 for d in differences), out
    rows = int(re.search(r"packed them into (\d+) rows", out).group(1))
    assert rows < 48  # packing put several requests in a row
