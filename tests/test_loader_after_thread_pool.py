"""An asynchronous loader started after torch's thread pool was used (issue: the forked worker
waited forever on the OpenMP team it inherited), in every sharing strategy and async mode."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The order the strategies run in, one process for all: Fork, the one that hung, goes last so
# that a hang there still lets the others be checked.
STRATEGIES = ["ForkServer", "SharedMemory", "FileSystem", "Fork"]
TIMEOUT_S = 300  # the four strategies take ~12 s on an idle two-core machine

# The reproduction, in Async and AsyncRebatched modes, compared with torch's DataLoader:
# a script without ``if __name__ == "__main__":``, which a worker that is not forked must not
# import again (see [Note: sharing strategies]). Each strategy reports on lines of its own; a
# strategy that fails reports why and lets the next one run.
SCRIPT = textwrap.dedent(
    """
    import sys
    import traceback
    import torch
    import poptorch

    torch.randn(512, 512) @ torch.randn(512, 512)  # torch's OpenMP team now exists
    ds = torch.utils.data.TensorDataset(torch.randn(16, 3, 224, 224), torch.arange(16))
    expected = list(torch.utils.data.DataLoader(ds, batch_size=4))
    opts = poptorch.Options().deviceIterations(2)
    for name in sys.argv[1:]:
        strategy = poptorch.SharingStrategy[name]
        try:
            for mode, extra in [
                (poptorch.DataLoaderMode.Async, {}),
                (poptorch.DataLoaderMode.AsyncRebatched, {"rebatched_worker_size": 1}),
            ]:
                print(name, mode.name, "started", flush=True)
                dl = poptorch.DataLoader(
                    opts, ds, batch_size=2, num_workers=1, mode=mode,
                    async_options={"sharing_strategy": strategy}, **extra,
                )
                got = list(dl)
                dl.terminate()
                assert len(got) == len(expected), (mode, len(got))
                for g, e in zip(got, expected):
                    torch.testing.assert_close(g[0], e[0], rtol=0, atol=0)
                    torch.testing.assert_close(g[1], e[1], rtol=0, atol=0)
                print(name, mode.name, "ok", flush=True)
        except Exception:
            print(name, "failed", flush=True)
            print(f"--- {name}:", traceback.format_exc(), file=sys.stderr, flush=True)
    """
)


@pytest.fixture(scope="module")
def reproduction(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, bool]:
    """The script's stdout, its stderr and whether it hung, for all strategies."""
    script = tmp_path_factory.mktemp("repro") / "repro.py"
    script.write_text(SCRIPT)
    try:
        done = subprocess.run(
            [sys.executable, str(script), *STRATEGIES],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as expired:
        return _text(expired.stdout), _text(expired.stderr), True
    return done.stdout, done.stderr + f"\n(exit status {done.returncode})", False


def _text(output: str | bytes | None) -> str:
    return output.decode() if isinstance(output, bytes) else output or ""


@pytest.mark.parametrize("strategy", ["ForkServer", "Fork", "SharedMemory", "FileSystem"])
def test_async_loader_after_a_busy_thread_pool_equals_torch(
    strategy: str, reproduction: tuple[str, str, bool]
) -> None:
    stdout, stderr, hung = reproduction
    lines = [
        line.split(maxsplit=1)[1] for line in stdout.splitlines() if line.split()[:1] == [strategy]
    ]
    if hung and lines[-1:] != ["AsyncRebatched ok"]:
        started = [line for line in stdout.splitlines() if line.endswith("started")]
        where = started[-1] if started else "before any loader started"
        pytest.fail(f"the loader hung ({where}; SharingStrategy.{strategy}): {stdout!r}")
    assert lines == ["Async started", "Async ok", "AsyncRebatched started", "AsyncRebatched ok"], (
        stdout,
        stderr[-3000:],
    )
