"""Running one command of the garden: its own process group, a time limit, an optional stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from classify import TIMED_OUT

__all__ = ["STOPPED", "TIMED_OUT_RC", "run"]

TIMED_OUT_RC = -9  # what ``run`` returns for a command stopped at its time limit
STOPPED = -2  # what ``run`` returns for a command the runner stopped once it had done enough
POLL_S = 5.0  # how often the runner looks at the command's log and its time limit


def _end(proc: subprocess.Popen, first: int = signal.SIGINT, grace: float = 60.0) -> None:
    """Send ``first`` to ``proc``'s group (by default Ctrl-C: pytest still writes its report);
    kill the group ``grace`` seconds later if it is still running."""
    os.killpg(proc.pid, first)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _count(log: Path, pattern: re.Pattern[str]) -> int:
    return len(pattern.findall(log.read_text(errors="replace")))


def run(
    cmd: list[str],
    cwd: Path,
    log: Path,
    timeout: float,
    env: dict[str, str],
    stop_after: tuple[str, int] | None = None,
) -> int:
    """Run ``cmd`` in its own process group, output to ``log``.

    Args:
        cmd: the command.
        cwd: where it runs.
        log: its output (stdout and stderr).
        timeout: seconds before it is stopped; the log then ends with ``TIMED_OUT``.
        env: its environment.
        stop_after: ``(pattern, n)``: stop it once ``n`` lines of its output match ``pattern``
            (a command with no flag that bounds its work).

    Returns:
        Its exit status; ``TIMED_OUT_RC`` when it ran out of time, ``STOPPED`` when
        ``stop_after`` stopped it.
    """
    pattern = re.compile(stop_after[0]) if stop_after else None
    deadline = time.monotonic() + timeout
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        while True:
            try:
                return proc.wait(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
            if pattern is not None and stop_after and _count(log, pattern) >= stop_after[1]:
                # Done: no report to wait for (CLIP's training goes on for a minute after Ctrl-C).
                _end(proc, signal.SIGTERM, 10.0)
                with log.open("a") as tail:
                    tail.write(f"\n[model_garden] stopped after {stop_after[1]} steps\n")
                return STOPPED
            if time.monotonic() >= deadline:
                _end(proc)
                with log.open("a") as tail:
                    tail.write(f"\n{TIMED_OUT} {timeout:.0f} s\n")
                return TIMED_OUT_RC
