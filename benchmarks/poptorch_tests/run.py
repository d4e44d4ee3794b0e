"""Run PopTorch's own tests, unmodified, against poptorch_sim and classify each failure.

Usage (PopTorch's tests are fetched into a scratch folder first; nothing of them is committed)::

    python -m benchmarks.poptorch_tests.run POPTORCH_CHECKOUT [FILE ...] [--all] [--timeout 120]

``POPTORCH_CHECKOUT`` is a folder holding PopTorch's ``tests/``. With no files, the 16 core files
run; ``--all`` adds every other ``tests/*_test.py`` / ``test_*.py`` (and ``--gnn`` the ``gnn/``
folder). Each file runs in its own ``pytest`` process with a junit XML report, a per-test timeout
(pytest-timeout when importable, else faulthandler's dump) and a per-file wall limit. The failed
cases of a file then run a second time with the environment's obstacles removed
(``second_pass.py``; ``--first-only`` skips it). The table prints per file and in total: passed,
failed, skipped and each failure's class (rules in ``rules.py``) by the first error, then the
same counts after the obstacles.
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

from benchmarks.poptorch_tests import second_pass
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
    # The second pass (obstacles removed): "" where the case did not run again.
    after: str = ""
    after_cls: str = ""
    after_reason: str = ""
    after_message: str = ""

    def final(self) -> tuple[str, str]:
        """Outcome and class after the obstacles (the first ones where it did not run again)."""
        return (self.after, self.after_cls) if self.after else (self.outcome, self.cls)


@dataclass
class FileResult:
    """One file's cases and the time its pytest process took."""

    file: str
    seconds: float
    cases: list[Case] = field(default_factory=list)
    note: str = ""

    def count(self, outcome: str, cls: str | None = None, after: bool = False) -> int:
        pairs = (c.final() if after else (c.outcome, c.cls) for c in self.cases)
        return sum(1 for o, k in pairs if o == outcome and (cls is None or k == cls))


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


def pytest_command(targets: list[str], xml: Path, timeout: int) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *targets]
    cmd += [f"--junitxml={xml}", "-o", "junit_logging=no", "-rN", "--tb=line"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        # Installed plugins load through their entry point; naming it with -p again is refused.
        # The signal method fails the one test and goes on (the thread method ends the file).
        cmd += [f"--timeout={timeout}", "--timeout-method=signal"]
    else:
        cmd += ["-o", f"faulthandler_timeout={timeout}"]
    return cmd


def _stem(file: str) -> str:
    return file.replace("/", "__")


def _pytest(cmd: list[str], tests: Path, file: str, log: Path, wall: int, extra: dict) -> str:
    """Run one pytest command from ``tests``; a note when it ran past ``wall`` seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PROJECT), str(tests)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["POPTORCH_SIM_NUM_IPUS"] = str(NUM_IPUS.get(file, DEFAULT_NUM_IPUS))
    # Tests that re-run pytest call `python3`: make it this interpreter, as in PopTorch's CI
    # (a python3 found elsewhere on PATH lacks torch and the test dependencies).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    with open(log, "w") as sink:
        try:
            done = subprocess.run(
                cmd,
                cwd=tests,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=wall,
                check=False,
                preexec_fn=_default_sigint,
            )
        except subprocess.TimeoutExpired:
            return f"file stopped after {wall} s"
    return "usage error" if done.returncode == 4 else ""


def run_file(tests: Path, file: str, out: Path, timeout: int, wall: int) -> FileResult:
    """Run one file in its own pytest process and read its junit XML."""
    xml = out / (_stem(file) + ".xml")
    xml.unlink(missing_ok=True)
    start = time.monotonic()
    note = _pytest(
        pytest_command([file], xml, timeout), tests, file, out / (_stem(file) + ".log"), wall, {}
    )
    return read_report(out, FileResult(file, time.monotonic() - start, note=note))


def run_again(checkout: Path, result: FileResult, out: Path, timeout: int, wall: int) -> None:
    """Run ``result``'s failed cases again with the obstacles removed; record what they gave.

    The cases run by node id; where pytest refuses one (a usage error), the whole file runs."""
    failed = [c for c in result.cases if c.outcome == "failed"]
    if not failed:
        return
    tests = second_pass.prepare_copy(checkout, out)
    xml = out / (_stem(result.file) + ".after.xml")
    log = out / (_stem(result.file) + ".after.log")
    extra = {**second_pass.ENV}
    plugin = ["-p", second_pass.PLUGIN]
    targets = [second_pass.node_id(result.file, c.name) for c in failed]
    for chosen in (targets, [result.file]):
        xml.unlink(missing_ok=True)
        cmd = pytest_command(chosen, xml, timeout) + plugin
        note = _pytest(cmd, tests, result.file, log, wall, extra)
        if note != "usage error":
            break
    if note:
        result.note = (result.note + "; " if result.note else "") + "second pass: " + note
    read_after(out, result)


def read_after(out: Path, result: FileResult) -> None:
    """Fill the ``after`` fields of ``result``'s failed cases from the second pass's XML."""
    xml = out / (_stem(result.file) + ".after.xml")
    if not xml.exists():
        return
    again = {c.name: c for c in map(read_case, ET.parse(xml).getroot().iter("testcase"))}
    for case in result.cases:
        later = again.get(case.name)
        if case.outcome == "failed" and later is not None:
            case.after, case.after_cls = later.outcome, later.cls
            case.after_reason, case.after_message = later.reason, later.message


def _default_sigint() -> None:
    # A runner started in the background (`cmd &` without job control) inherits SIGINT ignored,
    # and so would pytest and Python's KeyboardInterrupt; the tests that send SIGINT expect the
    # default, as in a terminal or CI.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_report(out: Path, result: FileResult) -> FileResult:
    """``result`` with its cases read (and classified) from the file's junit XML in ``out``."""
    xml = out / (_stem(result.file) + ".xml")
    if not xml.exists():
        result.note = result.note or "no junit report (see its .log)"
        return result
    result.cases = [read_case(case) for case in ET.parse(xml).getroot().iter("testcase")]
    read_after(out, result)
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


def print_table(results: list[FileResult], markdown: bool = False, after: bool = False) -> None:
    """Counts per file and in total: by the first error, or ``after`` the obstacles."""
    results = sorted(results, key=_order)
    head = ["file", "passed", "failed", "skipped", *CLASSES]
    rows = [head]
    for r in results:
        rows.append(
            [r.file + (f" ({r.note})" if r.note else "")]
            + [str(r.count(o, after=after)) for o in ("passed", "failed", "skipped")]
            + [str(r.count("failed", c, after=after)) for c in CLASSES]
        )
    total = ["total"] + [str(sum(int(row[i]) for row in rows[1:])) for i in range(1, len(head))]
    rows.append(total)
    if not markdown:
        print("after the obstacles:" if after else "by the first error:")
    if markdown:
        for i, row in enumerate(rows):
            print("| " + " | ".join(row) + " |")
            if i == 0:
                print("|" + "---|" * len(row))
        return
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


def print_failures(results: list[FileResult], markdown: bool = False, after: bool = False) -> None:
    """Each failure (by the first error, or ``after`` the obstacles) with its class."""
    failures = []
    for r in sorted(results, key=_order):
        for c in r.cases:
            outcome, cls = c.final() if after else (c.outcome, c.cls)
            reason = (c.after_reason if c.after else c.reason) if after else c.reason
            if outcome == "failed":
                failures.append((c.name, cls, reason))
    if markdown:  # one row per test function and reason
        groups: dict[tuple[str, str, str], int] = {}
        for name, cls, reason in failures:
            key = (name.split("[")[0], cls, reason)
            groups[key] = groups.get(key, 0) + 1
        print("| test | cases | class | reason |\n|---|---|---|---|")
        for (name, cls, reason), n in groups.items():
            print(f"| `{name}` | {n} | {cls} | {reason.replace('|', '/')} |")
        return
    for name, cls, reason in failures:
        print(f"{cls:10} {name}  -- {reason}")


def show_torch() -> None:
    """Run each reproduction in a fresh interpreter without poptorch; print its last line."""
    for name, code in REPRODUCTIONS.items():
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        lines = done.stderr.strip().splitlines() or ["(no error)"]
        last = next((x for x in reversed(lines) if "Error" in x), lines[-1])
        print(f"{name}: exit {done.returncode}: {last}")


def _report(results: list[FileResult], markdown: bool, failures: bool) -> None:
    """Both tables (and failure lists): by the first error, then after the obstacles."""
    for after in (False, True):
        print_table(results, markdown, after)
        if failures:
            print_failures(results, markdown, after)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
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
        help="print the tables of --out's summary.json; run nothing",
    )
    passes = parser.add_mutually_exclusive_group()
    passes.add_argument("--first-only", action="store_true", help="no second pass")
    passes.add_argument(
        "--again-only",
        action="store_true",
        help="only the second pass, of the failures --out's summary.json holds",
    )
    args = parser.parse_intermixed_args(argv)
    if not args.show_torch and not (args.checkout / "tests" / "conftest.py").exists():
        parser.error(f"{args.checkout} holds no PopTorch tests/conftest.py")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.show_torch:
        show_torch()
        return 0
    tests = args.checkout / "tests"
    files = args.files or (all_files(tests, args.gnn) if args.all else CORE_FILES)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = args.out / "summary.json"
    # Results of earlier runs into the same folder are kept; a file run again replaces its own.
    results = [load(x) for x in json.loads(summary.read_text())] if summary.exists() else []
    if args.report:  # classified again: the rules may have changed since the run
        chosen = set(args.files) if args.files else None
        results = [read_report(args.out, r) for r in results if chosen is None or r.file in chosen]
        _report(results, args.markdown, args.failures)
        return 0
    known = {r.file: r for r in results}
    for file in files:
        if args.again_only and file not in known:
            continue
        r = (
            known[file]
            if args.again_only
            else run_file(tests, file, args.out, args.timeout, args.wall)
        )
        if not args.first_only:
            run_again(args.checkout, r, args.out, args.timeout, args.wall)
        results = [x for x in results if x.file != file] + [r]
        print(
            f"{file}: {r.count('passed')} passed, {r.count('failed')} failed; after the"
            f" obstacles {r.count('passed', after=True)} passed, {r.count('failed', after=True)}"
            f" failed; in {r.seconds:.0f} s {r.note}",
            file=sys.stderr,
            flush=True,
        )
        summary.write_text(json.dumps([asdict(x) for x in results], indent=1))
    _report(results, False, args.failures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
