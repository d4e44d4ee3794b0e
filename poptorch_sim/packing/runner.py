"""Online packing: PopRT's PackRunner, batching single requests into packed model calls.

[Note: PackRunner's batching thread]
Any number of threads call ``execute_async(sample)``; each request goes into a bounded queue
(a full queue blocks the caller: back-pressure) and gets a ``concurrent.futures.Future``. One
batching thread takes the first waiting request, then keeps adding requests until the batch is
full or ``timeout_microseconds`` has passed since that first request, runs the model once on
the packed rows, and completes every request's future with its own unpacked outputs:

    request queue ──► batching thread:  fill rows (first-fit / next-fit)
                                        until max_valid_num requests, no room left, or the
                                        timeout ──► model(packed rows)
                                        ──► unpack ──► future.set_result per request

A batch is full when it holds ``max_valid_num`` requests or no row has a free token and slot.
A request that fits no row waits for the next batch while later ones may still fill this one;
the oldest waiting request always opens the next batch. Once ``batch_size`` requests wait so,
the batch runs. Empty rows and slots are zero (PopRT pads zeros the same way).
A failure of the model reaches every future of its batch; the thread carries on. ``close()``
runs what is queued, then joins the thread. The queue, the gathering and ``close`` are the
serving layer's ``Batcher`` (See [Note: the batching service]); this module says what a packed
batch is and how it runs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from ..serving.batcher import Batcher, Closed, fail_all
from .batch import MODEL_INPUTS, pack_rows, unpack

__all__ = ["PackAlgorithm", "PackRunner", "PackRunnerConfig", "PackRunnerStats"]


class PackAlgorithm:
    """Row placement of online requests (PopRT's ``runtime.PackAlgorithm`` values)."""

    first_fit = "first_fit"
    next_fit = "next_fit"


@dataclass(frozen=True)
class PackRunnerConfig:
    """How a ``PackRunner`` batches requests (PopRT's ``PackRunnerConfig`` plus our shape).

    Attributes:
        max_seq_len: tokens per packed row; also the longest request accepted.
        batch_size: packed rows per model call.
        max_sequences_per_pack: slots per row (``K``).
        max_valid_num: most requests per model call (PopRT's name); default
            ``batch_size × max_sequences_per_pack``.
        timeout_microseconds: how long a batch waits for more requests after its first one
            (PopRT's example default, 15000). 0 takes only what is already queued.
        queue_size: requests that may wait; ``execute_async`` blocks while it is full.
        algorithm: ``PackAlgorithm.first_fit`` or ``.next_fit``.
    """

    max_seq_len: int
    batch_size: int = 1
    max_sequences_per_pack: int = 8
    max_valid_num: int | None = None
    timeout_microseconds: int = 15000
    queue_size: int = 1024
    algorithm: str = PackAlgorithm.first_fit

    def __post_init__(self) -> None:
        for name in ("max_seq_len", "batch_size", "max_sequences_per_pack", "queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"PackRunnerConfig.{name} must be a positive int, got {value!r}")
        if self.max_sequences_per_pack == self.max_seq_len:
            raise ValueError(
                f"PackRunnerConfig.max_sequences_per_pack equals max_seq_len ({self.max_seq_len}): "
                "the runner tells per-token from per-sequence outputs by their size, so pick "
                "another max_sequences_per_pack"
            )
        if self.max_valid_num is not None and self.max_valid_num < 1:
            raise ValueError(
                f"PackRunnerConfig.max_valid_num must be >= 1, got {self.max_valid_num}"
            )
        if self.timeout_microseconds < 0:
            raise ValueError(
                f"PackRunnerConfig.timeout_microseconds must be >= 0, got {self.timeout_microseconds}"
            )
        if self.algorithm not in (PackAlgorithm.first_fit, PackAlgorithm.next_fit):
            raise ValueError(
                f"unknown PackRunnerConfig.algorithm {self.algorithm!r} (known: first_fit, next_fit)"
            )

    @property
    def requests_per_batch(self) -> int:
        """The most requests one model call carries."""
        slots = self.batch_size * self.max_sequences_per_pack
        return slots if self.max_valid_num is None else min(self.max_valid_num, slots)


@dataclass(frozen=True)
class PackRunnerStats:
    """What a runner has done so far."""

    batches: int
    requests: int
    tokens: int
    max_seq_len: int
    batch_size: int

    @property
    def fill(self) -> float:
        """Fraction of the token slots of all model calls that held real tokens."""
        slots = self.batches * self.batch_size * self.max_seq_len
        return self.tokens / slots if slots else 0.0


class _Request:
    def __init__(self, sample: Mapping[str, Any], length: int) -> None:
        self.sample = sample
        self.length = length
        self.future: Future[Any] = Future()


class _Batch:
    """Requests placed into ``batch_size`` rows of ``max_seq_len`` tokens."""

    def __init__(self, config: PackRunnerConfig) -> None:
        self.config = config
        self.rows: list[list[int]] = []
        self.used: list[int] = []
        self.requests: list[_Request] = []

    @property
    def full(self) -> bool:
        """At ``max_valid_num`` requests, or no row can take even a 1-token request."""
        cfg = self.config
        if len(self.requests) >= cfg.requests_per_batch:
            return True
        rows_closed = (
            used == cfg.max_seq_len or len(row) == cfg.max_sequences_per_pack
            for row, used in zip(self.rows, self.used)
        )
        return len(self.rows) == cfg.batch_size and all(rows_closed)

    def add(self, request: _Request) -> bool:
        """Place ``request``; False when no row can take it."""
        cfg = self.config
        first = max(len(self.rows) - 1, 0) if cfg.algorithm == PackAlgorithm.next_fit else 0
        for row in range(first, len(self.rows)):
            fits = self.used[row] + request.length <= cfg.max_seq_len
            if fits and len(self.rows[row]) < cfg.max_sequences_per_pack:
                return self._place(row, request)
        if len(self.rows) < cfg.batch_size:
            self.rows.append([])
            self.used.append(0)
            return self._place(len(self.rows) - 1, request)
        return False

    def _place(self, row: int, request: _Request) -> bool:
        self.rows[row].append(len(self.requests))
        self.used[row] += request.length
        self.requests.append(request)
        return True


class PackRunner:
    """Runs single variable-length requests through a model on packed, fixed-shape batches.

    Args:
        model: called as ``model(input_ids, attention_mask, position_ids, token_type_ids)``
            with ``[batch_size, max_seq_len]`` tensors (``packing.batch`` layout), e.g. an
            ``inferenceModel`` of a ``PackedBertForSequenceClassification``. It returns a
            tensor, or a tuple/dict of tensors, per token ``[B, L, ...]`` or per sequence
            ``[B, K, ...]``.
        config: the batching configuration.

    Each future's result is that request's own slice of every output (``unpack``).
    Use it as a context manager, or call ``close()``.

    >>> with PackRunner(model, PackRunnerConfig(max_seq_len=256, batch_size=16)) as runner:  # doctest: +SKIP
    ...     future = runner.execute_async({"input_ids": torch.tensor([101, 7592, 102])})
    ...     logits = future.result()
    """

    def __init__(self, model: Callable[..., Any], config: PackRunnerConfig) -> None:
        self.model = model
        self.config = config
        self._counts = [0, 0, 0]  # batches, requests, tokens
        self._batcher = Batcher(
            _Packer(self),
            max_queue=config.queue_size,
            timeout_s=config.timeout_microseconds / 1e6,
            max_held=config.batch_size,  # that many waiting for room: run what fits
            on_failure=fail_all,
            name="PackRunner",
            drain=True,
            join_timeout_s=None,  # close() runs every queued request
        )

    @property
    def _thread(self) -> threading.Thread:
        return self._batcher.threads[0]

    def execute_async(
        self, sample: Mapping[str, Any], timeout: float | None = None
    ) -> Future[Any]:
        """Queue one request; its future completes with the request's unpacked outputs.

        Args:
            sample: ``input_ids`` (1-D, unpadded) and optionally ``token_type_ids``.
            timeout: seconds to wait for room in a full queue (None: wait as long as needed).

        Returns:
            A ``concurrent.futures.Future``.

        Raises:
            ValueError: the request is empty or longer than ``max_seq_len``.
            TimeoutError: the queue stayed full for ``timeout`` seconds.
            RuntimeError: the runner is closed.
        """
        length = _request_length(sample)
        if not 1 <= length <= self.config.max_seq_len:
            raise ValueError(
                f"request of {length} tokens does not fit PackRunner's max_seq_len="
                f"{self.config.max_seq_len}: truncate or split it, or build the runner with a "
                "larger max_seq_len"
            )
        request = _Request(sample, length)
        try:
            self._batcher.submit(request, timeout)
        except Closed:
            raise RuntimeError(
                "PackRunner is closed: create a new runner to run requests"
            ) from None
        except queue.Full:
            raise TimeoutError(
                f"PackRunner's queue stayed full ({self.config.queue_size} requests) for "
                f"{timeout} s: wait for results, or raise PackRunnerConfig.queue_size"
            ) from None
        return request.future

    def execute(self, sample: Mapping[str, Any]) -> Any:
        """Run one request and wait for its outputs (``execute_async(sample).result()``)."""
        return self.execute_async(sample).result()

    @property
    def stats(self) -> PackRunnerStats:
        """Batches, requests and tokens run so far."""
        batches, requests, tokens = self._counts
        cfg = self.config
        return PackRunnerStats(batches, requests, tokens, cfg.max_seq_len, cfg.batch_size)

    def close(self) -> None:
        """Run every queued request, then stop and join the batching thread."""
        self._batcher.close(lambda: RuntimeError("PackRunner closed before this request ran"))

    def __enter__(self) -> PackRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self, batch: _Batch) -> list[Any]:
        """One model call on the packed rows; each request's own outputs."""
        live = [r.future.set_running_or_notify_cancel() for r in batch.requests]
        cfg = self.config
        rows = batch.rows + [[]] * (cfg.batch_size - len(batch.rows))
        packed = pack_rows(
            [r.sample for r in batch.requests],
            rows,
            cfg.max_seq_len,
            cfg.max_sequences_per_pack,
            label_keys=(),
        )
        outputs = self.model(*(packed.inputs[k] for k in MODEL_INPUTS))
        results = unpack(outputs, packed.info)
        self._counts[0] += 1
        self._counts[1] += len(batch.requests)
        self._counts[2] += sum(r.length for r in batch.requests)
        return [_detach(results[i]) if ok else None for i, ok in enumerate(live)]


class _Packer:
    """``PackRunner``'s batches for the ``Batcher``: packed rows, run by the runner."""

    def __init__(self, runner: PackRunner) -> None:
        self.runner = runner

    def open(self) -> _Batch:
        return _Batch(self.runner.config)

    def call(self, batch: _Batch) -> list[Any]:
        return self.runner._run(batch)


def _request_length(sample: Mapping[str, Any]) -> int:
    """Tokens in a request, checked where the caller can see the error."""
    if "input_ids" not in sample:
        raise ValueError(f"a request needs 'input_ids', got keys {sorted(sample)}")
    shapes = {
        k: tuple(torch.as_tensor(sample[k]).shape)
        for k in ("input_ids", "token_type_ids")
        if k in sample
    }
    if len(shapes["input_ids"]) != 1 or len(set(shapes.values())) != 1:
        raise ValueError(
            f"a request's input_ids (and token_type_ids) must be 1-D and equally long, got {shapes}"
        )
    return shapes["input_ids"][0]


def _detach(value: Any) -> Any:
    """An independent copy of one request's outputs (not a view of the whole batch)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: _detach(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_detach(v) for v in value)
    return value
