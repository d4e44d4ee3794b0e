"""Run PopTorch's own tests, unmodified, against poptorch_sim and classify each failure.

Usage (PopTorch's tests are fetched into a scratch folder first; nothing of them is committed)::

    python -m benchmarks.poptorch_tests.run POPTORCH_CHECKOUT [FILE ...] [--all] [--timeout 120]

``POPTORCH_CHECKOUT`` is a folder holding PopTorch's ``tests/``. With no files, the 16 core files
run; ``--all`` adds every other ``tests/*_test.py`` / ``test_*.py`` (and ``--gnn`` the ``gnn/``
folder). Each file runs in its own ``pytest`` process with a junit XML report, a per-test timeout
(pytest-timeout when importable, else faulthandler's dump) and a per-file wall limit. The table
prints per file and in total: passed, failed, skipped, and each failure's class (rules in
``rules.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.poptorch_tests.rules import CLASSES, REPRODUCTIONS, classify

PROJECT = Path(__file__).resolve().parents[2]

CORE_FILES = [
    "batching_test.py",
    "outputs_test.py",
    "inputs_test.py",
    "weights_writing_test.py",
    "custom_loss_test.py",
    "buffers_test.py",
    "optimizers_test.py",
    "options_test.py",
    "dataloader_test.py",
    "poplar_executor_test.py",
    "pipelining_test.py",
    "misc_test.py",
    "requires_grad_test.py",
    "sharding_test.py",
    "loop_test.py",
    "cpu_op_test.py",
]

# Files whose cases need a machine setting other than the default (64 simulated IPUs).
NUM_IPUS: dict[str, int] = {}
DEFAULT_NUM_IPUS = 64


@dataclass
class Case:
    """One test case's outcome."""

    name: str
    outcome: str  # passed | failed | skipped
    cls: str = ""
    reason: str = ""
    message: str = ""


@dataclass
class FileResult:
    """One file's cases and the time its pytest process took."""

    file: str
    seconds: float
    cases: list[Case] = field(default_factory=list)
    note: str = ""

    def count(self, outcome: str, cls: str | None = None) -> int:
        return sum(1 for c in self.cases if c.outcome == outcome and (cls is None or c.cls == cls))


def all_files(tests: Path, gnn: bool) -> list[str]:
    """Every test file of PopTorch's ``tests/``: the core files first, then the rest by name."""
    names = sorted(
        p.name
        for p in tests.iterdir()
        if p.suffix == ".py" and (p.name.endswith("_test.py") or p.name.startswith("test_"))
    )
    rest = [n for n in names if n not in CORE_FILES]
    if gnn:
        rest += sorted(
            str(p.relative_to(tests))
            for p in (tests / "gnn").rglob("*.py")
            if p.name.endswith("_test.py") or p.name.startswith("test_")
        )
    return CORE_FILES + rest


def pytest_command(file: str, xml: Path, timeout: int) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", file]
    cmd += [f"--junitxml={xml}", "-o", "junit_logging=no", "-rN", "--tb=line"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        # Installed plugins load through their entry point; naming it with -p again is refused.
        # The signal method fails the one test and goes on (the thread method ends the file).
        cmd += [f"--timeout={timeout}", "--timeout-method=signal"]
    else:
        cmd += ["-o", f"faulthandler_timeout={timeout}"]
    return cmd


def run_file(tests: Path, file: str, out: Path, timeout: int, wall: int) -> FileResult:
    """Run one file in its own pytest process and read its junit XML."""
    xml = out / (file.replace("/", "__") + ".xml")
    xml.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT), str(tests)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["POPTORCH_SIM_NUM_IPUS"] = str(NUM_IPUS.get(file, DEFAULT_NUM_IPUS))
    # Tests that re-run pytest call `python3`: make it this interpreter, as in PopTorch's CI
    # (a python3 found elsewhere on PATH lacks torch and the test dependencies).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    start = time.monotonic()
    note = ""
    log = out / (file.replace("/", "__") + ".log")
    with open(log, "w") as sink:
        try:
            subprocess.run(
                pytest_command(file, xml, timeout),
                cwd=tests,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=wall,
                check=False,
                preexec_fn=_default_sigint,
            )
        except subprocess.TimeoutExpired:
            note = f"file stopped after {wall} s"
    return read_report(out, FileResult(file, time.monotonic() - start, note=note))


def _default_sigint() -> None:
    # A runner started in the background (`cmd &` without job control) inherits SIGINT ignored,
    # and so would pytest and Python's KeyboardInterrupt; the tests that send SIGINT expect the
    # default, as in a terminal or CI.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_report(out: Path, result: FileResult) -> FileResult:
    """``result`` with its cases read (and classified) from the file's junit XML in ``out``."""
    xml = out / (result.file.replace("/", "__") + ".xml")
    if not xml.exists():
        result.note = result.note or "no junit report (see its .log)"
        return result
    result.cases = [read_case(case) for case in ET.parse(xml).getroot().iter("testcase")]
    return result


def read_case(case: ET.Element) -> Case:
    name = f"{case.get('classname', '')}::{case.get('name', '')}"
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            message = (node.get("message") or "") + "\n" + (node.text or "")
            cls, reason = classify(name, message)
            text = message.strip()
            if len(text) > 2000:  # log-reading failures end with what they looked for
                text = text[:500] + "\n[...]\n" + text[-1500:]
            return Case(name, "failed", cls, reason, text)
    if case.find("skipped") is not None:
        return Case(name, "skipped")
    return Case(name, "passed")


def load(raw: dict) -> FileResult:
    """A ``FileResult`` read back from summary.json."""
    cases = [Case(**c) for c in raw.pop("cases")]
    return FileResult(**raw, cases=cases)


def _order(result: FileResult) -> tuple[int, str]:
    core = result.file in CORE_FILES
    return (CORE_FILES.index(result.file) if core else len(CORE_FILES), result.file)


def print_table(results: list[FileResult], markdown: bool = False) -> None:
    results = sorted(results, key=_order)
    head = ["file", "passed", "failed", "skipped", *CLASSES]
    rows = [head]
    for r in results:
        rows.append(
            [r.file + (f" ({r.note})" if r.note else "")]
            + [str(r.count(o)) for o in ("passed", "failed", "skipped")]
            + [str(r.count("failed", c)) for c in CLASSES]
        )
    total = ["total"] + [str(sum(int(row[i]) for row in rows[1:])) for i in range(1, len(head))]
    rows.append(total)
    if markdown:
        for i, row in enumerate(rows):
            print("| " + " | ".join(row) + " |")
            if i == 0:
                print("|" + "---|" * len(row))
        return
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


def print_failures(results: list[FileResult], markdown: bool = False) -> None:
    if markdown:  # one row per test function and reason
        groups: dict[tuple[str, str, str], int] = {}
        for r in sorted(results, key=_order):
            for c in r.cases:
                if c.outcome == "failed":
                    key = (c.name.split("[")[0], c.cls, c.reason)
                    groups[key] = groups.get(key, 0) + 1
        print("| test | cases | class | reason |\n|---|---|---|---|")
        for (name, cls, reason), n in groups.items():
            print(f"| `{name}` | {n} | {cls} | {reason.replace('|', '/')} |")
        return
    for r in results:
        for c in r.cases:
            if c.outcome == "failed":
                print(f"{c.cls:10} {c.name}  -- {c.reason}")


def show_torch() -> None:
    """Run each reproduction in a fresh interpreter without poptorch; print its last line."""
    for name, code in REPRODUCTIONS.items():
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        lines = done.stderr.strip().splitlines() or ["(no error)"]
        last = next((x for x in reversed(lines) if "Error" in x), lines[-1])
        print(f"{name}: exit {done.returncode}: {last}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="folder holding PopTorch's tests/")
    parser.add_argument("files", nargs="*", help="test files (default: the 16 core files)")
    parser.add_argument("--all", action="store_true", help="every test file, core files first")
    parser.add_argument("--gnn", action="store_true", help="with --all, also tests/gnn/")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test case")
    parser.add_argument("--wall", type=int, default=3600, help="seconds per file")
    parser.add_argument("--out", type=Path, default=Path("poptorch_tests_out"))
    parser.add_argument("--failures", action="store_true", help="list every failure")
    parser.add_argument("--markdown", action="store_true", help="the table in Markdown")
    parser.add_argument(
        "--show-torch",
        action="store_true",
        help="run the plain torch/Python reproductions of the 'torch' class; run nothing else",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="print the table of --out's summary.json; run nothing",
    )
    args = parser.parse_intermixed_args(argv)
    if args.show_torch:
        show_torch()
        return 0
    tests = args.checkout / "tests"
    if not (tests / "conftest.py").exists():
        parser.error(f"{args.checkout} holds no PopTorch tests/conftest.py")
    files = args.files or (all_files(tests, args.gnn) if args.all else CORE_FILES)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "summary.json"
    # Results of earlier runs into the same folder are kept; a file run again replaces its own.
    results = [load(x) for x in json.loads(summary.read_text())] if summary.exists() else []
    if args.report:  # classified again: the rules may have changed since the run
        chosen = set(args.files) if args.files else None
        results = [read_report(args.out, r) for r in results if chosen is None or r.file in chosen]
        print_table(results, args.markdown)
        if args.failures:
            print_failures(results, args.markdown)
        return 0
    for file in files:
        results = [x for x in results if x.file != file]
        results.append(run_file(tests, file, args.out, args.timeout, args.wall))
        r = results[-1]
        print(
            f"{file}: {r.count('passed')} passed, {r.count('failed')} failed"
            f" in {r.seconds:.0f} s {r.note}",
            file=sys.stderr,
            flush=True,
        )
        summary.write_text(json.dumps([asdict(x) for x in results], indent=1))
    print_table(results)
    if args.failures:
        print_failures(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
