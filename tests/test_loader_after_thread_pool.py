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

# The reproduction, in Async and AsyncRebatched modes, compared with torch's DataLoader:
# a script without ``if __name__ == "__main__":``, which a worker that is not forked must not
# import again (see [Note: sharing strategies]).
SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import poptorch

    strategy = poptorch.SharingStrategy[sys.argv[1]]
    torch.randn(512, 512) @ torch.randn(512, 512)  # torch's OpenMP team now exists
    ds = torch.utils.data.TensorDataset(torch.randn(16, 3, 224, 224), torch.arange(16))
    expected = list(torch.utils.data.DataLoader(ds, batch_size=4))
    opts = poptorch.Options().deviceIterations(2)
    for mode, extra in [
        (poptorch.DataLoaderMode.Async, {}),
        (poptorch.DataLoaderMode.AsyncRebatched, {"rebatched_worker_size": 1}),
    ]:
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
        print(mode.name, "ok", flush=True)
    """
)


@pytest.mark.parametrize("strategy", ["ForkServer", "Fork", "SharedMemory", "FileSystem"])
def test_async_loader_after_a_busy_thread_pool_equals_torch(strategy: str, tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(SCRIPT)
    try:
        done = subprocess.run(
            [sys.executable, str(script), strategy],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the loader hung (SharingStrategy.{strategy}): {expired.stdout!r}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["Async", "ok", "AsyncRebatched", "ok"]
