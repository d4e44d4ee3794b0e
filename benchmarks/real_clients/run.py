"""Runs real PopTorch clients, unmodified, on poptorch_sim: each in a scratch environment.

    python benchmarks/real_clients/run.py --lightning LIGHTNING_GRAPHCORE_CHECKOUT \\
        --optimum OPTIMUM_GRAPHCORE_CHECKOUT [--work DIR] [--keep]

The checkouts are your own clones (nothing of them is in this repository):
github.com/Lightning-AI/lightning-Graphcore at tag v0.1.0 and
github.com/huggingface/optimum-graphcore at tag v0.7.1. Each client gets a virtual environment
under ``--work`` whose site-packages holds the client's pinned packages and a ``.pth`` naming this
project and then the project's environment (as ``benchmarks/model_garden/garden.py`` does), so the
client's pins win and the project's torch and poptorch_sim fill the rest.

- lightning-graphcore: ``lightning==2.0.9`` and the suite's test requirements, then its own
  ``tests/`` (pytest); prints the summary line and each failure's first error line.
- optimum-graphcore: the package with its pins (transformers 4.29.2, numpy<1.24), then ``optimum_bert.py``:
  pipelined BERT over 2 and 4 IPUs against eager.

The environments are deleted at the end unless ``--keep``. Exit status 1 if a step failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
# lightning 2.0.9 predates NumPy 2 (np.Inf) and imports pkg_resources (gone from setuptools 81).
LIGHTNING_PINS = [
    "lightning==2.0.9",
    "torchmetrics>=0.8.0,<1.3.0",
    "scikit-learn>0.22.1,<1.4.0",
    "numpy<2",
]
SETUPTOOLS = (
    "setuptools<70"  # alone, without deps: pip would otherwise pick a torch that allows it
)
# optimum 1.6.1 pins numpy<1.24: datasets and pyarrow of its time (newer pyarrow needs NumPy 2).
OPTIMUM_PINS = ["datasets==2.12.0", "pyarrow<15"]
# torch 2.14 deprecates pytree's LeafSpec(), which lightning 2.0.9 calls; the suite turns every
# FutureWarning into an error.
LIGHTNING_WARNING = "ignore:`isinstance(treespec, LeafSpec)` is deprecated:FutureWarning"
INSTALL_TIMEOUT, TEST_TIMEOUT = 1800, 1800


def _run(cmd: list[str], cwd: Path, log: Path, timeout: float) -> int:
    """``cmd`` with its output in ``log``; its return code, or -9 at the time limit."""
    env = {**os.environ, "POPTORCH_SIM_OFFLINE": "1", "PIP_NO_INPUT": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return -9


def make_env(work: Path, name: str, extra: tuple[Path, ...] = ()) -> Path:
    """A fresh virtual environment ``work/envs/name`` that sees the project after its own packages
    (and the folders ``extra``)."""
    env_dir = work / "envs" / name
    shutil.rmtree(env_dir, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    purelib = subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    shared = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "poptorch_sim_project.pth").write_text("\n".join([str(PROJECT), *shared]))
    if extra:
        Path(purelib, "client_checkout.pth").write_text("\n".join(map(str, extra)))
    return python


def pip_install(python: Path, work: Path, name: str, args: list[str]) -> bool:
    """``pip install args``; True if it installed."""
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    rc = _run(cmd, work, work / f"{name}-install.log", INSTALL_TIMEOUT)
    if rc != 0:
        print(f"{name}: install failed (rc {rc}), see {work / f'{name}-install.log'}")
    return rc == 0


def _failures(log: str) -> list[str]:
    """Each ``FAILED``/``ERROR`` line of pytest's short summary."""
    return [line for line in log.splitlines() if re.match(r"^(FAILED|ERROR) ", line)]


def lightning(checkout: Path, work: Path) -> bool:
    """lightning-graphcore's own suite; True if the install and the run completed."""
    python = make_env(work, "lightning", (checkout / "src",))  # its setup.py needs pkg_resources
    if not pip_install(python, work, "lightning", LIGHTNING_PINS):
        return False
    if not pip_install(python, work, "setuptools", ["--no-deps", SETUPTOOLS]):
        return False
    log = work / "lightning-tests.log"
    cmd = [str(python), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--color=no"]
    cmd += ["-W", LIGHTNING_WARNING, "tests"]
    start = time.perf_counter()
    rc = _run(cmd, checkout, log, TEST_TIMEOUT)
    text = log.read_text(errors="replace")
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    print(f"lightning-graphcore tests (rc {rc}, {time.perf_counter() - start:.0f} s):")
    print("  " + (summary[-1] if summary else "no summary line, see " + str(log)))
    for line in _failures(text):
        print("  " + line[:300])
    return rc in (0, 1)


def optimum(checkout: Path, work: Path) -> bool:
    """optimum-graphcore's pipelined BERT against eager; True if every case matched."""
    python = make_env(work, "optimum")
    if not pip_install(python, work, "optimum", [str(checkout), *OPTIMUM_PINS]):
        return False
    log = work / "optimum-bert.log"
    rc = _run([str(python), str(HERE / "optimum_bert.py")], work, log, TEST_TIMEOUT)
    print(f"optimum-graphcore pipelined BERT against eager (rc {rc}):")
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") or rc not in (0, 1):
            print("  " + line[:600])
    return rc == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lightning", type=Path, help="lightning-Graphcore checkout at v0.1.0")
    parser.add_argument("--optimum", type=Path, help="optimum-graphcore checkout at v0.7.1")
    parser.add_argument("--work", type=Path, default=Path("/tmp/poptorch_sim-clients"))
    parser.add_argument("--keep", action="store_true", help="keep the environments")
    args = parser.parse_args()
    if not (args.lightning or args.optimum):
        parser.error("give --lightning CHECKOUT, --optimum CHECKOUT or both")
    args.work.mkdir(parents=True, exist_ok=True)
    ok = True
    try:
        if args.lightning:
            ok &= lightning(args.lightning.resolve(), args.work)
        if args.optimum:
            ok &= optimum(args.optimum.resolve(), args.work)
    finally:
        if not args.keep:
            shutil.rmtree(args.work / "envs", ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
