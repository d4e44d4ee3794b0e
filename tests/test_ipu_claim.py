"""Options.useIpuId: one attached model per IPU id, in this process and across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import poptorch
from poptorch_sim import hardware

ROOT = Path(__file__).resolve().parents[1]


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _opts(ipu_id: int) -> poptorch.Options:
    opts = poptorch.Options()
    opts.useIpuId(ipu_id)
    return opts


def test_second_model_on_one_ipu_is_refused_until_the_first_detaches() -> None:
    model = _Linear()
    x = torch.randn(4)
    first = poptorch.inferenceModel(model, _opts(7))
    second = poptorch.inferenceModel(model, _opts(7))
    torch.testing.assert_close(first(x), model(x))
    with pytest.raises(poptorch.Error, match=r"Failed to acquire IPU with id 7"):
        second.compile(x)
    first.detachFromDevice()
    torch.testing.assert_close(second(x), model(x))  # compiles and attaches now
    with pytest.raises(poptorch.Error, match=r"Failed to acquire IPU with id 7"):
        first(x)  # the implicit attach of a detached model is refused too
    second.destroy()
    torch.testing.assert_close(first(x), model(x))


def test_other_ids_and_unset_ids_share_nothing() -> None:
    model = _Linear()
    x = torch.randn(4)
    a = poptorch.inferenceModel(model, _opts(8))
    b = poptorch.inferenceModel(model, _opts(9))
    c = poptorch.inferenceModel(model)
    d = poptorch.inferenceModel(model)
    for m in (a, b, c, d):
        torch.testing.assert_close(m(x), model(x))


def test_a_collected_model_gives_its_ipu_back() -> None:
    model = _Linear()
    x = torch.randn(4)
    poptorch.inferenceModel(model, _opts(10))(x)  # never referenced again
    torch.testing.assert_close(poptorch.inferenceModel(model, _opts(10))(x), model(x))


_HOLD = textwrap.dedent(
    """
    import sys, time, torch, poptorch
    opts = poptorch.Options()
    opts.useIpuId(11)
    m = poptorch.inferenceModel(torch.nn.Linear(4, 2), opts)
    m.compile(torch.randn(4))
    print("attached", flush=True)
    sys.stdin.readline()
    m.detachFromDevice()
    """
)


def test_another_process_holding_the_ipu(monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "attached"
        model = _Linear()
        x = torch.randn(4)
        with pytest.raises(poptorch.Error, match=r"id 11: .* in another process"):
            poptorch.inferenceModel(model, _opts(11)).compile(x)
        # POPTORCH_WAIT_FOR_IPU=1: wait for the holder instead of failing.
        monkeypatch.setenv("POPTORCH_WAIT_FOR_IPU", "1")
        monkeypatch.setattr(hardware, "_WAIT_S", 0.05)  # retries every 0.5 s otherwise
        assert holder.stdin is not None
        stdin = holder.stdin

        def let_go() -> None:
            stdin.write("\n")
            stdin.flush()

        timer = threading.Timer(0.5, let_go)  # the holder detaches while we wait
        timer.start()
        waiting = poptorch.inferenceModel(model, _opts(11))
        torch.testing.assert_close(waiting(x), model(x))
        timer.join()
    finally:
        holder.kill() if holder.poll() is None else None
        holder.wait()


def test_a_failed_compile_can_be_retried_on_its_ipu() -> None:
    class Picky(nn.Module):
        def forward(self, x):
            if x.shape[0] != 4:
                raise ValueError("needs 4 rows")
            return x * 2

    model = poptorch.inferenceModel(Picky(), _opts(12))
    with pytest.raises(ValueError, match="needs 4 rows"):
        model(torch.randn(3))
    torch.testing.assert_close(model(torch.ones(4)), torch.full((4,), 2.0))
