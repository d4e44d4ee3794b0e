"""PackRunner: concurrent producers, timeout flushes, full batches, back-pressure and errors."""

from __future__ import annotations

import threading

import pytest
import torch

import poptorch_sim as poptorch
from poptorch_sim.packing import PackAlgorithm, PackRunner, PackRunnerConfig

WAIT = 60.0  # seconds a test waits for a future before calling it a hang


class Recorder:
    """A packed model with a known answer per request: token-wise and per-sequence outputs."""

    def __init__(self, slots: int, gate: threading.Event | None = None) -> None:
        self.slots = slots
        self.gate = gate
        self.entered = threading.Event()
        self.calls: list[torch.Tensor] = []  # attention_mask of every call

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(WAIT)
        self.calls.append(attention_mask.clone())
        numbers = torch.arange(1, self.slots + 1)
        member = attention_mask[:, None, :] == numbers[None, :, None]
        sums = (member * input_ids[:, None, :]).sum(-1)  # [B, K]
        return input_ids * 10 + position_ids, sums


def _request(length: int, first: int = 1) -> dict:
    return {"input_ids": torch.arange(first, first + length)}


def _expected(request: dict) -> tuple[torch.Tensor, torch.Tensor]:
    ids = request["input_ids"]
    return ids * 10 + torch.arange(len(ids)), ids.sum()


def test_eight_concurrent_producers_each_get_their_own_result() -> None:
    config = PackRunnerConfig(
        max_seq_len=32, batch_size=4, max_sequences_per_pack=4, timeout_microseconds=2000
    )
    model = Recorder(4)
    results: dict[tuple[int, int], tuple] = {}
    errors: list[BaseException] = []

    def produce(producer: int, runner: PackRunner) -> None:
        generator = torch.Generator().manual_seed(producer)
        try:
            pending = []
            for k in range(25):
                length = int(torch.randint(1, 33, (1,), generator=generator))
                request = _request(length, first=1000 * producer + 7 * k)
                pending.append((k, request, runner.execute_async(request)))
            for k, request, future in pending:
                results[producer, k] = (future.result(WAIT), _expected(request))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    with PackRunner(model, config) as runner:
        threads = [threading.Thread(target=produce, args=(p, runner)) for p in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        stats = runner.stats
    assert not errors, errors
    assert len(results) == 200
    for got, want in results.values():
        torch.testing.assert_close(got, want)
    assert stats.requests == 200 and stats.batches == len(model.calls)
    assert stats.batches < 200  # requests shared batches
    assert all(mask.shape == (4, 32) for mask in model.calls)  # fixed shape every call


def test_timeout_flushes_a_partial_batch() -> None:
    config = PackRunnerConfig(
        max_seq_len=16, batch_size=4, max_sequences_per_pack=4, timeout_microseconds=20_000
    )
    model = Recorder(4)
    with PackRunner(model, config) as runner:
        futures = [runner.execute_async(_request(n)) for n in (3, 5, 2)]
        for future, n in zip(futures, (3, 5, 2)):
            torch.testing.assert_close(future.result(WAIT), _expected(_request(n)))
    requests_per_call = [int((mask.amax(-1)).sum()) for mask in model.calls]
    assert sum(requests_per_call) == 3  # each call ran partial: 16 requests would fill it
    assert all(mask.shape == (4, 16) for mask in model.calls)  # zero rows fill the batch
    assert (model.calls[-1][-1] == 0).all()  # the last row of a partial batch is empty


def test_a_full_batch_runs_without_waiting_for_the_timeout() -> None:
    config = PackRunnerConfig(
        max_seq_len=8,
        batch_size=2,
        max_sequences_per_pack=2,
        max_valid_num=3,
        timeout_microseconds=3_600_000_000,  # an hour: only fullness can launch the batch
    )
    model = Recorder(2)
    with PackRunner(model, config) as runner:
        futures = [runner.execute_async(_request(n)) for n in (2, 2, 2)]
        assert [f.result(WAIT)[1] for f in futures] == [torch.tensor(3)] * 3
        assert len(model.calls) == 1


@pytest.mark.parametrize(
    "algorithm, rows",
    [
        (PackAlgorithm.first_fit, [[1] * 6 + [2] * 2, [1] * 3 + [0] * 5]),
        (PackAlgorithm.next_fit, [[1] * 6 + [0] * 2, [1] * 3 + [2] * 2 + [0] * 3]),
    ],
)
def test_rows_are_filled_first_fit_or_next_fit(algorithm: str, rows: list[list[int]]) -> None:
    config = PackRunnerConfig(
        max_seq_len=8,
        batch_size=2,
        max_sequences_per_pack=2,
        max_valid_num=3,
        timeout_microseconds=3_600_000_000,
        algorithm=algorithm,
    )
    model = Recorder(2)
    with PackRunner(model, config) as runner:
        futures = [runner.execute_async(_request(n)) for n in (6, 3, 2)]
        for future in futures:
            future.result(WAIT)
    assert model.calls[0].tolist() == rows


def test_a_request_that_does_not_fit_opens_the_next_batch() -> None:
    config = PackRunnerConfig(
        max_seq_len=8, batch_size=1, max_sequences_per_pack=4, timeout_microseconds=3_600_000_000
    )
    model = Recorder(4)
    with PackRunner(model, config) as runner:
        futures = [runner.execute_async(_request(n)) for n in (5, 4, 4)]
        for future, n in zip(futures, (5, 4, 4)):
            torch.testing.assert_close(future.result(WAIT), _expected(_request(n)))
    assert [int(m.amax()) for m in model.calls] == [1, 2]  # [5] then [4, 4]


def test_later_requests_fill_the_room_a_long_one_could_not_take() -> None:
    config = PackRunnerConfig(
        max_seq_len=8, batch_size=2, max_sequences_per_pack=4, timeout_microseconds=3_600_000_000
    )
    model = Recorder(4)
    runner = PackRunner(model, config)
    futures = [runner.execute_async(_request(n)) for n in (5, 6, 7, 3)]
    runner.close()  # runs the second, partial batch now instead of after an hour
    for future, n in zip(futures, (5, 6, 7, 3)):
        torch.testing.assert_close(future.result(WAIT), _expected(_request(n)))
    # 7 fits neither row of the first batch; 3 behind it still joins 5.
    assert model.calls[0].tolist() == [[1] * 5 + [2] * 3, [1] * 6 + [0] * 2]
    assert model.calls[1].tolist() == [[1] * 7 + [0], [0] * 8]


@pytest.mark.parametrize(
    "request_, message",
    [
        (_request(9), r"request of 9 tokens does not fit PackRunner's max_seq_len=8"),
        ({"input_ids": torch.zeros(0, dtype=torch.long)}, r"request of 0 tokens"),
        ({"input_ids": torch.ones(2, 3)}, r"must be 1-D and equally long"),
        ({"tokens": [1, 2]}, r"a request needs 'input_ids'"),
    ],
    ids=["too-long", "empty", "2-d", "no-input-ids"],
)
def test_bad_requests_are_refused_in_the_callers_thread(request_: dict, message: str) -> None:
    config = PackRunnerConfig(max_seq_len=8, max_sequences_per_pack=4)
    with PackRunner(Recorder(4), config) as runner:
        with pytest.raises(ValueError, match=message):
            runner.execute_async(request_)
        torch.testing.assert_close(runner.execute(_request(8)), _expected(_request(8)))


def test_a_full_queue_pushes_back_on_producers() -> None:
    gate = threading.Event()
    config = PackRunnerConfig(max_seq_len=4, queue_size=2, timeout_microseconds=0)
    model = Recorder(8, gate)
    with PackRunner(model, config) as runner:
        first = runner.execute_async(_request(4))
        assert model.entered.wait(WAIT)  # the batching thread is busy with it, at the gate
        queued = [runner.execute_async(_request(4), timeout=WAIT) for _ in range(2)]
        with pytest.raises(TimeoutError, match=r"queue stayed full \(2 requests\)"):
            runner.execute_async(_request(4), timeout=0.05)
        gate.set()
        for future in [first, *queued]:
            torch.testing.assert_close(future.result(WAIT), _expected(_request(4)))


def test_a_model_failure_reaches_every_future_of_its_batch_and_the_runner_goes_on() -> None:
    calls = []

    def flaky(*inputs: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return inputs[0]

    config = PackRunnerConfig(
        max_seq_len=8,
        max_sequences_per_pack=4,
        max_valid_num=2,
        timeout_microseconds=3_600_000_000,
    )
    with PackRunner(flaky, config) as runner:
        failed = [runner.execute_async(_request(2)) for _ in range(2)]
        for future in failed:
            with pytest.raises(RuntimeError, match="device lost"):
                future.result(WAIT)
        again = [runner.execute_async(_request(3)) for _ in range(2)]
        assert [f.result(WAIT).tolist() for f in again] == [[1, 2, 3]] * 2


def test_close_runs_queued_requests_then_refuses_new_ones() -> None:
    config = PackRunnerConfig(
        max_seq_len=8, max_sequences_per_pack=4, timeout_microseconds=3_600_000_000
    )
    runner = PackRunner(Recorder(4), config)
    futures = [runner.execute_async(_request(1)) for _ in range(3)]
    runner.close()  # the hour-long timeout is cut short: close() flushes
    assert all(f.done() for f in futures)
    assert not runner._thread.is_alive()
    with pytest.raises(RuntimeError, match="PackRunner is closed"):
        runner.execute_async(_request(1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_sequences_per_pack": 4, "batch_size": 0}, "batch_size must be a positive int"),
        (
            {"max_sequences_per_pack": 4, "timeout_microseconds": -1},
            "timeout_microseconds must be >= 0",
        ),
        (
            {"max_sequences_per_pack": 4, "algorithm": "best_fit"},
            "unknown PackRunnerConfig.algorithm 'best_fit'",
        ),
        ({"max_sequences_per_pack": 8}, "max_sequences_per_pack equals max_seq_len"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PackRunnerConfig(max_seq_len=8, **kwargs)


def test_pack_runner_over_an_inference_model_of_the_packed_bert() -> None:
    transformers = pytest.importorskip("transformers")
    from poptorch_sim.packing import PackedBertForSequenceClassification

    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    inference = poptorch.inferenceModel(PackedBertForSequenceClassification(model, 4))
    requests = [_request(n, first=n) for n in (3, 16, 7, 1, 9, 5, 12, 2)]
    runner_config = PackRunnerConfig(
        max_seq_len=16, batch_size=2, max_sequences_per_pack=4, timeout_microseconds=5000
    )
    with PackRunner(inference, runner_config) as runner:
        futures = [runner.execute_async(r) for r in requests]
        for request, future in zip(requests, futures):
            want = model(input_ids=request["input_ids"][None]).logits[0]
            torch.testing.assert_close(future.result(WAIT), want)
    inference.destroy()
