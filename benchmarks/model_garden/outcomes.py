"""The outcome of each test of a suite, read from pytest's per-test report log or its JUnit XML.

The report log (pytest-reportlog's ``--report-log``: one JSON line per test phase, written and
flushed as the phase ends) survives a suite stopped at its time limit, where pytest may write no
JUnit report at all; the JUnit XML is the fallback when the plugin is not installed.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from _pytest.reports import CollectReport, TestReport

__all__ = ["Case", "Suite", "read_junit", "read_report_log"]

_RANK = {"passed": 0, "skipped": 1, "failed": 2}  # a test's outcome is its worst phase's


@dataclass(frozen=True)
class Case:
    """One test (or one module that failed to collect).

    Attributes:
        name: its pytest node id (JUnit: ``classname.name``).
        outcome: ``passed``, ``failed`` or ``skipped``.
        message: the failure's one-line message (pytest's ``reprcrash``), with `` <- `` and the
            exception that ended the script the test ran where it printed one, "" if none.
        text: the failure's message and traceback as pytest prints them, then the end of what
            the test printed (an app's test that runs a script prints the script's traceback),
            "" if none.
    """

    name: str
    outcome: str
    message: str = ""
    text: str = ""


@dataclass(frozen=True)
class Suite:
    """What a report says of a suite.

    Attributes:
        cases: the tests that finished, in the order they finished.
        running: the tests that started and did not finish (the one a stop interrupted).
        finished: whether the session ended (a stopped suite's log has no end).
    """

    cases: list[Case]
    running: list[str]
    finished: bool


def _last_traceback(captured: str) -> str:
    """What a test printed, from its last Python traceback on (a script the test ran and that
    failed), or its last lines when it printed none; the rest (warnings, progress) is noise
    that the classifier would misread."""
    start = captured.rfind("Traceback (most recent call last)")
    return captured[start:] if start >= 0 else captured[-2000:]


def _exception_line(printed: str) -> str:
    """The ``Type: message`` line that ends a Python traceback; with no traceback, the last
    line logged at level ERROR (a script that logs why and exits); "" if neither."""
    lines = printed.splitlines()
    if printed.startswith("Traceback"):
        return next((line for line in lines[1:] if line and not line[0].isspace()), "")
    return next((line.strip() for line in reversed(lines) if "ERROR" in line), "")


def _failure(report: TestReport | CollectReport) -> tuple[str, str]:
    """The report's one-line message and its text: message, traceback, then the end of what
    the test printed. A test that ran a script and saw it fail gets the script's exception
    added to its message."""
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)):  # a skip: (path, line, reason); a list in JSON
        return str(longrepr[2]), ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        message = crash.message
    else:  # a fixture-lookup error and the like: its first "E" line says what is wrong
        lines = str(longrepr).strip().splitlines()
        message = next((x[1:].strip() for x in lines if x.startswith("E ")), lines[-1])
    captured = _last_traceback("".join(body for _, body in report.sections))
    cause = _exception_line(captured)
    if cause and cause not in message:
        message += f" <- {cause}"
    return message, f"{message}\n{longrepr}\n{captured}"


def read_report_log(path: Path) -> Suite:
    """The suite's outcomes from a pytest report log (``--report-log``).

    A line that does not parse (the last one of a killed process may be cut short) is skipped.

    Args:
        path: the report log, one JSON object a line.

    Returns:
        The finished tests, the ones still running when the log ended, and whether it ended.
    """
    cases: dict[str, Case] = {}
    open_tests: dict[str, None] = {}  # set up and not torn down, in order
    finished = False
    for line in path.read_text(errors="replace").splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = data.get("$report_type")
        if kind == "SessionFinish":
            finished = True
        if kind not in ("TestReport", "CollectReport"):
            continue
        if kind == "CollectReport":
            report: TestReport | CollectReport = CollectReport._from_json(data)
            if report.outcome == "passed":
                continue  # a module or class collected: not a test
        else:
            report = TestReport._from_json(data)
            if report.when == "setup":
                open_tests[report.nodeid] = None
            if report.when == "teardown" or report.outcome != "passed":
                open_tests.pop(report.nodeid, None)
            if report.when != "call" and report.outcome == "passed":
                if report.when == "teardown" or report.nodeid in cases:
                    continue
        message, text = _failure(report) if report.outcome != "passed" else ("", "")
        case = Case(report.nodeid, report.outcome, message, text)
        old = cases.get(report.nodeid)
        if old is None or _RANK[case.outcome] > _RANK[old.outcome]:
            cases[report.nodeid] = case
    # A test that passed its setup and then stopped has no outcome yet.
    done = [c for c in cases.values() if c.name not in open_tests]
    return Suite(done, list(open_tests), finished)


def read_junit(path: Path) -> Suite:
    """The suite's outcomes from a JUnit XML report (written only when pytest ends)."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            cases.append(Case(name, "skipped"))
        elif bad is None:
            cases.append(Case(name, "passed"))
        else:
            message = bad.get("message") or ""
            printed = "".join(case.findtext(tag) or "" for tag in ("system-out", "system-err"))
            captured = _last_traceback(printed)
            cause = _exception_line(captured)
            if cause and cause not in message:
                message += f" <- {cause}"
            text = "\n".join([message, bad.text or "", captured])
            cases.append(Case(name, "failed", message, text))
    return Suite(cases, [], True)
