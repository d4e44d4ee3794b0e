"""Runs Graphcore's model-garden applications, unmodified, on poptorch_sim and prints a table.

For each application (``apps.APPS``): a scratch environment (created once, reused), the app's
requirements installed where they install, its whole test suite (pytest, JUnit XML, a time limit
per test and one for the suite) and its training commands; every failure is sorted by
``classify.classify``. Invoked by ``run.sh``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from apps import APPS, NOT_ATTEMPTED, SKIPPED_REQUIREMENTS, App, Train  # noqa: E402
from classify import CLASSES, classify  # noqa: E402
from outcomes import Suite, read_junit, read_report_log  # noqa: E402
from process import STOPPED, TIMED_OUT_RC  # noqa: E402
from process import run as _run  # noqa: E402

_NAME = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?")


@dataclass
class Step:
    """What one step (install, tests, train) gave."""

    app: str
    what: str
    result: str
    classes: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _requirement_name(line: str) -> str:
    if line.startswith("git+"):  # git+https://host/owner/Name.git@ref: the package Name
        line = line.split("@")[-2 if line.count("@") > 1 else 0].rstrip("/").split("/")[-1]
        line = line.removesuffix(".git")
    match = _NAME.match(line)
    return match.group(1).lower().replace("_", "-") if match else ""


_VCS = re.compile(r"git\+https?://[^@\s]+/([^/@\s]+?)(?:\.git)?(?:@([^\s#;]+))?(?=$|[\s#;])")


def _from_clone(line: str, clones: Path | None) -> str:
    """``line`` with a ``git+https://host/owner/NAME@ref`` URL replaced by the local clone
    ``clones/NAME`` (checked out at ``ref``), when there is one."""
    match = _VCS.search(line)
    if clones is None or match is None or not (clones / match.group(1)).is_dir():
        return line
    clone = clones / match.group(1)
    if match.group(2):
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", match.group(2)], check=False)
    target = str(clone) if " @ " in line else f"{_requirement_name(line)} @ file://{clone}"
    if " @ " in line:
        return line[: match.start()] + f"file://{target}" + line[match.end() :]
    return target


def _requirements(
    app: App, checkout: Path, skipped: list[str], clones: Path | None = None
) -> list[str]:
    """The app's requirement lines, without the skipped ones, with ``app.pins`` applied and
    git URLs taken from local ``clones``; lines not attempted are appended to ``skipped``."""
    path = checkout / app.path / "requirements.txt"
    lines = []
    for raw in path.read_text().splitlines() if path.exists() else []:
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        name = _requirement_name(line)
        if any(line.startswith(s) or name == s for s in SKIPPED_REQUIREMENTS):
            continue
        if name in NOT_ATTEMPTED:
            skipped.append(f"{line} ({NOT_ATTEMPTED[name]})")
            continue
        line = _from_clone(line, clones)
        if name in app.pins:  # a version, or "" for the newest
            line = f"{name}=={app.pins[name]}" if app.pins[name] else name
        if line not in lines:
            lines.append(line)
    return lines


def make_env(
    app: App, checkout: Path, project: Path, work: Path, clones: Path | None = None
) -> tuple[Path, Step]:
    """The app's scratch environment (made on first use) and what installing gave."""
    env_dir = work / "envs" / app.key
    python = env_dir / "bin" / "python"
    step = Step(app.key, "install requirements", "")
    start = time.perf_counter()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    purelib = subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    ).strip()
    shared = [p for p in site.getsitepackages() if Path(p).is_dir()]
    # After the env's own site-packages: the app's pins win, the project fills the rest.
    # Written on every run: a reused environment runs the --project of this run.
    Path(purelib, "poptorch_sim_project.pth").write_text("\n".join([str(project), *shared]))
    record = env_dir / "model_garden_install.json"
    _test_plugins(python, work)
    if record.exists():  # installed by an earlier run: reuse (delete the folder to redo)
        done = json.loads(record.read_text())
        step.result, step.notes = done["result"], done["notes"]
        step.classes.update(done["classes"])
        return python, step
    skipped: list[str] = []
    lines = _requirements(app, checkout, skipped, clones)
    constraints = work / "constraints.txt"
    import numpy  # noqa: PLC0415  (the project's numpy stays; pip sees the project's torch)

    constraints.write_text(f"numpy=={numpy.__version__}\n")
    reqs = work / f"{app.key}-requirements.txt"
    reqs.write_text("\n".join(lines) + "\n")
    pip = [
        str(python),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-c",
        str(constraints),
    ]
    cargo = Path.home() / ".cargo" / "bin"  # rustup's default: old tokenizers build from source
    env = {**os.environ, "PIP_NO_INPUT": "1", "PATH": f"{cargo}{os.pathsep}{os.environ['PATH']}"}
    log = work / f"{app.key}-install.log"
    failed: list[str] = []
    kept: list[str] = []
    if lines and _run([*pip, "-r", str(reqs)], checkout, log, 1800, env) != 0:
        for line in lines:  # one at a time: keep what installs
            name = _requirement_name(line)
            one = work / f"{app.key}-install-{name}.log"
            if _run([*pip, line], checkout, one, 900, env) == 0:
                kept.append(line)
                continue
            newest = work / f"{app.key}-install-{name}-newest.log"
            pinned = "==" in line or "git+" in line
            if pinned and name and _run([*pip, name], checkout, newest, 900, env) == 0:
                step.notes.append(f"{line} did not install: the newest {name} did")
                continue
            failed.append(line)
        # A later line's dependencies may have moved an earlier pin: put the pins back.
        pinned = work / f"{app.key}-pinned.txt"
        pinned.write_text("\n".join(x for x in kept if "==" in x) + "\n")
        _run([*pip, "--no-deps", "-r", str(pinned)], checkout, work / "pins.log", 900, env)
    step.result = f"{len(lines) - len(failed)}/{len(lines)} installed"
    _stand_ins(python, project, step)
    if failed:
        step.classes["environment"] += len(failed)
        step.notes.append("not installed: " + ", ".join(failed))
    if skipped:
        step.notes.append("not attempted: " + ", ".join(skipped))
    step.seconds = time.perf_counter() - start
    done = {"result": step.result, "notes": step.notes, "classes": dict(step.classes)}
    record.write_text(json.dumps(done))
    return python, step


def _test_plugins(python: Path, work: Path) -> None:
    """pytest-timeout (each test of a suite gets its own time limit) and pytest-reportlog (each
    test's outcome is written as it finishes, so a suite stopped at its limit still tells what
    ran) in the environment."""
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps"]
    for module in ("pytest_timeout", "pytest_reportlog"):
        if not _has_module(python, module):
            package = module.replace("_", "-")
            _run([*pip, package], work, work / f"{package}-install.log", 900, dict(os.environ))


def _has_module(python: Path, module: str) -> bool:
    probe = [str(python), "-c", f"import {module}"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def _stand_ins(python: Path, project: Path, step: Step) -> None:
    """Put the single-process Horovod stand-in on the path if the real one did not install."""
    probe = subprocess.run(
        [str(python), "-c", "import horovod.torch, horovod; print(horovod.__version__)"],
        capture_output=True,
        text=True,
    )
    if probe.returncode == 0 and "stand-in" not in probe.stdout:
        return
    purelib = subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    Path(purelib, "zz_model_garden_stand_ins.pth").write_text(
        str(Path(__file__).parent / "standins")
    )
    step.notes.append("horovod: the single-process stand-in (standins/horovod)")


def _ini_python_paths(checkout: Path) -> list[str]:
    """The checkout's ``pytest.ini`` ``python_paths`` (set by the pytest-pythonpath plugin,
    which predates the pytest here): put on PYTHONPATH instead."""
    ini = checkout / "pytest.ini"
    for line in ini.read_text().splitlines() if ini.exists() else []:
        if line.strip().startswith("python_paths"):
            return [str(checkout / p) for p in line.split("=", 1)[1].split()]
    return []


_COLLECTED = re.compile(r"collected (\d+) items?")


def run_tests(
    app: App, python: Path, checkout: Path, project: Path, work: Path, limits: tuple[float, float]
) -> Step:
    """The app's whole pytest suite, each failure classified.

    ``limits`` is ``(suite, case)``: seconds for the whole suite and for each test (a test past
    its limit fails alone, as a hang; the suite past its limit is one more failure, and the
    result says how many of the collected tests ran)."""
    step = Step(app.key, "tests: pytest " + " ".join(app.tests), "")
    if not app.tests:
        step.result = "no tests"
        return step
    xml, report_log = work / f"{app.key}-tests.xml", work / f"{app.key}-tests.jsonl"
    xml.unlink(missing_ok=True)
    report_log.unlink(missing_ok=True)
    cmd = [str(python), "-m", "pytest", *app.tests, "-p", "no:cacheprovider", "-rN"]
    cmd += ["--junitxml", str(xml), "-o", "junit_logging=all"]
    cmd += [f"--timeout={limits[1]:.0f}", "--timeout-method=signal"]
    if _has_module(python, "pytest_reportlog"):
        cmd += ["--report-log", str(report_log)]
    start = time.perf_counter()
    env = _env(app, python)
    env["PYTHONPATH"] = os.pathsep.join([*_ini_python_paths(checkout), env.get("PYTHONPATH", "")])
    cwd = checkout / app.path
    log = work / f"{app.key}-tests.log"
    rc = _run(cmd, cwd, log, limits[0], env)
    step.seconds = time.perf_counter() - start
    text = log.read_text(errors="replace")
    # The report log first: it holds every finished test even when the suite was stopped.
    suite = read_report_log(report_log) if report_log.exists() else None
    if suite is None and xml.exists():
        suite = read_junit(xml)
    if suite is None:
        step.result = f"no report (exit {rc})"
        step.classes[classify(text[-4000:], str(project), str(cwd))] += 1
        return step
    failures = work / f"{app.key}-tests-failures.tsv"
    counts = count_cases(suite, step, str(project), str(cwd), failures)
    step.result = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped"))
    collected = _COLLECTED.search(text)
    ran = sum(counts.values())
    if collected:
        step.result += f" of {collected.group(1)} collected"
    if rc == TIMED_OUT_RC:
        where = f", in {', '.join(suite.running)}" if suite.running else ""
        step.result += f" (suite stopped at its {limits[0]:.0f} s limit{where} after {ran} tests)"
        step.classes[classify(text[-4000:], str(project), str(cwd))] += 1
    return step


def count_cases(
    suite: Suite, step: Step, project: str, cwd: str, failures: Path | None = None
) -> Counter[str]:
    """Outcome counts of ``suite``; each failure classified into ``step`` (a poptorch_sim
    failure also noted with its message) and, with ``failures``, listed there one a line:
    node id, class, message (tab-separated), so each class can be checked against its text."""
    counts: Counter[str] = Counter()
    rows = []
    for case in suite.cases:
        counts[case.outcome] += 1
        if case.outcome != "failed":
            continue
        kind = classify(case.text, project, cwd)
        step.classes[kind] += 1
        message = " ".join(case.message.split())
        rows.append(f"{case.name}\t{kind}\t{message[:300]}")
        if kind == "poptorch_sim":
            step.notes.append(f"{case.name}: {message[:160]}")
    if failures is not None:
        failures.write_text("".join(row + "\n" for row in rows))
    return counts


def reread(app: App, checkout: Path, project: Path, work: Path) -> Step:
    """The step of the app's last suite, read again from its report log (``--reread``)."""
    step = Step(app.key, "tests (read again): pytest " + " ".join(app.tests), "")
    suite = read_report_log(work / f"{app.key}-tests.jsonl")
    failures = work / f"{app.key}-tests-failures.tsv"
    counts = count_cases(suite, step, str(project), str(checkout / app.path), failures)
    step.result = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "skipped"))
    if suite.running:
        step.result += f" (stopped in {', '.join(suite.running)})"
    return step


def run_train(
    app: App, train: Train, python: Path, checkout: Path, project: Path, work: Path, timeout: float
) -> Step:
    """One training command of the app, its failure classified from the log's tail."""
    step = Step(app.key, "train: " + " ".join(train.argv), "")
    log = work / f"{app.key}-train-{app.train.index(train)}.log"
    start = time.perf_counter()
    cwd = checkout / app.path
    stop = (train.steps, train.steps_wanted) if train.steps else None
    rc = _run([str(python), *train.argv], cwd, log, timeout, _env(app, python), stop)
    step.seconds = time.perf_counter() - start
    if rc == 0:
        step.result = "passed"
        return step
    if rc == STOPPED:
        step.result = f"passed ({train.steps_wanted} steps, then stopped by the runner)"
        return step
    step.result = "failed" if rc != TIMED_OUT_RC else "stopped at the time limit"
    tail = log.read_text(errors="replace")[-6000:]
    kind = classify(tail, str(project), str(cwd))
    step.classes[kind] += 1
    last = [line for line in tail.splitlines() if line.strip()][-1:] or [""]
    step.notes.append(last[0][:200])
    return step


def _env(app: App, python: Path) -> dict[str, str]:
    """The app's environment, activated: apps' tests start ``python`` from PATH."""
    bin_dir = python.parent
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(bin_dir.parent),
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "disabled",
        **app.env,
    }


def table(steps: list[Step]) -> str:
    """A markdown table of ``steps``."""
    rows = ["| app | what ran | result | failures by class | notes |", "|---|---|---|---|---|"]
    for s in steps:
        classes = ", ".join(f"{s.classes[c]} {c}" for c in CLASSES if s.classes[c]) or "-"
        notes = "; ".join(s.notes).replace("|", "/")[:400] or ""
        rows.append(
            f"| {s.app} | {s.what} ({s.seconds:.0f} s) | {s.result} | {classes} | {notes} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("checkout", type=Path, help="a clone of github.com/graphcore/examples")
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--work", type=Path, default=Path("model_garden_work"))
    parser.add_argument("--steps", default="tests,train")
    parser.add_argument(
        "--clones",
        type=Path,
        help="a folder of local git clones (e.g. examples-utils) for requirements given as "
        "git+https URLs, used where the URL cannot be reached",
    )
    parser.add_argument(
        "--test-timeout", type=float, default=4 * 3600, help="seconds for one app's whole suite"
    )
    parser.add_argument(
        "--case-timeout", type=float, default=900, help="seconds for one test of a suite"
    )
    parser.add_argument(
        "--train-timeout", type=float, default=1200, help="seconds for one training command"
    )
    parser.add_argument("--clean", action="store_true", help="delete the environments at the end")
    parser.add_argument(
        "--reread",
        action="store_true",
        help="run nothing: class again the failures of each app's last suite (its report log "
        "in --work) with this runner's rules",
    )
    args = parser.parse_args()
    checkout, project, work = args.checkout.resolve(), args.project.resolve(), args.work.resolve()
    if args.reread:
        print(table([reread(APPS[key], checkout, project, work) for key in args.apps.split(",")]))
        return
    work.mkdir(parents=True, exist_ok=True)
    steps: list[Step] = []
    for key in args.apps.split(","):
        app = APPS[key]
        python, installed = make_env(app, checkout, project, work, args.clones)
        steps.append(installed)
        done = len(steps) - 1
        if "tests" in args.steps:
            limits = (args.test_timeout, args.case_timeout)
            steps.append(run_tests(app, python, checkout, project, work, limits))
        for train in app.train if "train" in args.steps else ():
            steps.append(
                run_train(app, train, python, checkout, project, work, args.train_timeout)
            )
        print("\n".join(table(steps[done:]).splitlines()[2:]), flush=True)
        if args.clean:
            shutil.rmtree(work / "envs" / app.key, ignore_errors=True)
    commit = subprocess.run(
        ["git", "-C", str(project), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    examples = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"{stamp}; poptorch_sim {commit}; graphcore/examples {examples}; "
        f"Python {platform.python_version()} on {platform.machine()} ({os.cpu_count()} CPUs)"
    )
    text = header + "\n\n" + table(steps)
    (work / "table.md").write_text(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
