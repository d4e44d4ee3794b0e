"""The serving Runner: concurrent callers get their own results, batching, failures, bounds."""

from __future__ import annotations

import datetime
import threading
from concurrent.futures import Future

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.errors import Error
from poptorch_sim.executor.inputs import BoundArgs
from poptorch_sim.serving import ModelRunner, Runner, RuntimeConfig
from poptorch_sim.serving.requests import Request, Signature, join, split

WAIT_S = 30.0  # every wait in these tests is bounded
MODE = poptorch.OverlapMode.OverlapDeviceIterationLoop


class Scorer(nn.Module):
    """Refuses negative inputs (a request-dependent failure); overlapped IO when asked."""

    def __init__(self, overlap: bool) -> None:
        super().__init__()
        self.overlap = overlap
        self.lin = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.overlap:
            x = poptorch.set_overlap_for_input(x, MODE)
        if bool((x < 0).any()):
            raise ValueError("negative input")
        y = self.lin(x) * 2
        return poptorch.set_overlap_for_output(y, MODE) if self.overlap else y


def _model(overlap: bool, di: int = 4) -> tuple[nn.Module, poptorch.PoplarExecutor]:
    module = Scorer(overlap)
    opts = poptorch.Options().deviceIterations(di)
    if overlap:
        opts.setExecutionStrategy(poptorch.ShardedExecution())
        opts.TensorLocations.numIOTiles(64)
    return module, poptorch.inferenceModel(module, opts)


def _results(futures: list[Future]) -> list:
    return [f.result(timeout=WAIT_S) for f in futures]


@pytest.mark.parametrize("overlap", [True, False], ids=["io-tiles", "no-io-tiles"])
def test_eight_threads_each_get_their_own_results(overlap):
    module, model = _model(overlap)
    inputs = [torch.rand(2 * (1 + i % 2), 5) + i for i in range(8)]  # 1 or 2 micro-batches
    outputs: list = [None] * 8
    errors: list = []
    config = RuntimeConfig(timeout_ns=datetime.timedelta(milliseconds=2), micro_batch_size=2)
    with Runner(model, config) as runner:

        def call(i: int) -> None:
            try:
                for _ in range(3):
                    outputs[i] = runner.execute_async(inputs[i]).result(timeout=WAIT_S)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in threads), "a caller is still waiting"
    assert not errors
    with torch.no_grad():
        for x, got in zip(inputs, outputs):
            torch.testing.assert_close(got, module(x))
    model.destroy()


def test_requests_are_batched_into_one_call_in_arrival_order(monkeypatch):
    module, model = _model(overlap=True)
    config = RuntimeConfig(timeout_ns=datetime.timedelta(seconds=10), max_in_flight=1)
    with Runner(model, config) as runner:
        calls: list[int] = []
        original = runner._call
        monkeypatch.setattr(
            runner, "_call", lambda batch: calls.append(len(batch)) or original(batch)
        )
        xs = [torch.rand(1, 5) for _ in range(4)]
        futures = [runner.execute_async(x) for x in xs]  # 4 micro-batches of 1 row: one call
        results = _results(futures)
    assert calls == [4]
    with torch.no_grad():
        for x, got in zip(xs, results):
            torch.testing.assert_close(got, module(x))
    model.destroy()


def test_a_timed_out_batch_runs_zero_filled():
    module, model = _model(overlap=False)
    with Runner(model, RuntimeConfig(timeout_ns=0, micro_batch_size=1)) as runner:
        x = torch.rand(3, 5)
        got = runner.execute_async(x).result(timeout=WAIT_S)  # 3 of 4 rows, no wait
    with torch.no_grad():
        torch.testing.assert_close(got, module(x))
    assert got.shape == (3, 3)


@pytest.mark.parametrize("overlap", [True, False], ids=["io-tiles", "no-io-tiles"])
def test_a_failing_request_reaches_its_caller_only_and_serving_goes_on(overlap):
    module, model = _model(overlap)
    config = RuntimeConfig(timeout_ns=datetime.timedelta(milliseconds=50), micro_batch_size=1)
    with Runner(model, config) as runner:
        xs = [torch.rand(1, 5) for _ in range(8)]
        xs[3] = -xs[3]
        futures = [runner.execute_async(x) for x in xs]
        for i, future in enumerate(futures):
            if i == 3:
                with pytest.raises(Exception, match="negative input"):
                    future.result(timeout=WAIT_S)
            else:
                with torch.no_grad():
                    torch.testing.assert_close(future.result(timeout=WAIT_S), module(xs[i]))
        later = torch.rand(1, 5)
        with torch.no_grad():
            torch.testing.assert_close(runner.execute(later), module(later))
    model.destroy()


def test_a_bad_request_is_refused_in_the_callers_thread():
    _, model = _model(overlap=False)
    with Runner(model, RuntimeConfig(micro_batch_size=2)) as runner:
        with pytest.raises(Error, match=r"multiple of the micro-batch size \(2\)"):
            runner.execute_async(torch.rand(3, 5))
        with pytest.raises(Error, match="up to one model call's batch"):
            runner.execute_async(torch.rand(10, 5))
        with pytest.raises(Error, match="torch.float64 of rows"):
            runner.execute_async(torch.rand(2, 5, dtype=torch.float64))
        assert runner.execute(torch.ones(2, 5)).shape == (2, 3)


def test_the_queue_is_bounded_and_close_fails_waiting_requests():
    entered, gate = threading.Event(), threading.Event()

    class Gated(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            entered.set()
            if not gate.wait(WAIT_S):
                raise TimeoutError("gate never opened")
            return x + 1

    model = poptorch.inferenceModel(Gated())
    gate.set()
    model(torch.zeros(1, 2))  # compile while the gate is open
    gate.clear()
    entered.clear()
    config = RuntimeConfig(timeout_ns=0, max_queue=1, max_in_flight=1, submit_timeout_s=0.1)
    runner = Runner(model, config)
    try:
        first = runner.execute_async(torch.zeros(1, 2))
        assert entered.wait(WAIT_S)  # the feeder is inside the model with the first request
        second = runner.execute_async(torch.ones(1, 2))  # waits in the queue
        with pytest.raises(Error, match=r"request queue is full \(1 requests waiting"):
            runner.execute_async(torch.ones(1, 2))
    finally:
        gate.set()
        runner.close()
    torch.testing.assert_close(first.result(timeout=WAIT_S), torch.ones(1, 2))
    assert second.done()
    if second.exception() is not None:  # close() came before a feeder took it
        assert "closed" in str(second.exception())
    with pytest.raises(Error, match="closed"):
        runner.execute(torch.ones(1, 2))


def test_runner_serves_inference_models_with_output_mode_all_only():
    module = Scorer(False)
    with pytest.raises(Error, match="inferenceModel"):
        Runner(poptorch.trainingModel(module))
    opts = poptorch.Options().deviceIterations(2).outputMode(poptorch.OutputMode.Final)
    with pytest.raises(Error, match="OutputMode.All"):
        Runner(poptorch.inferenceModel(module, opts))
    assert ModelRunner is Runner


def test_join_pads_and_split_hands_back_rows():
    sig = Signature(BoundArgs((torch.zeros(2, 3),), ("x",), {}), None, 4)
    a = Request(BoundArgs((torch.ones(2, 3),), ("x",), {}), 1)
    b = Request(BoundArgs((torch.full((4, 3), 2.0),), ("x",), {}), 2)
    joined = join([a, b], sig)
    assert joined.args[0].shape == (8, 3)
    torch.testing.assert_close(joined.args[0][:6].sum(0), torch.full((3,), 10.0))
    assert joined.args[0][6:].abs().sum() == 0  # the free slot is zeros
    output = (torch.arange(8.0), {"s": torch.arange(4.0)})  # 2 rows / 1 row per slot
    first, second = split(output, [a, b], 4)
    torch.testing.assert_close(first[0], torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(second[1]["s"], torch.tensor([1.0, 2.0]))
