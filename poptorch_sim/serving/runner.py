"""``Runner``: serves an ``inferenceModel`` to any number of threads, as PopRT's runner does.

Callers put requests on a bounded queue; feeder threads take them in order, join as many as
fit into one model call (waiting up to ``timeout_ns`` for the batch to fill, then padding it
with zeros), call the model and hand each caller its own rows::

    execute / execute_async ──► [bounded request queue] ──► feeder 0 ─┐
                                                          ──► feeder 1 ─┼─► inferenceModel
                                                          ──► feeder 2 ─┘   (IO tiles: load /
    Future.result() ◄──────────── each request's rows ◄──────────────────    compute / store)

One feeder gathers at a time (so batches fill in arrival order), and up to ``max_in_flight``
model calls run at once: with IO tiles (overlapped IO) their micro-batches are loaded, computed
and stored at the same time, three deep, which is why PopRT asks for at least three feeding
threads; without IO tiles the model runs one call at a time.

A request that fails in the model is retried alone, so its error reaches its caller only; the
runner keeps serving the others. The queue, the gathering, ``close`` and that retry are the
``Batcher``'s (See [Note: the batching service]); this module says what a batch of rows is.
"""

from __future__ import annotations

import datetime
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..enums import OutputMode
from ..errors import Error
from ..executor.executor import PoplarExecutor, compiled_batch
from ..executor.layout import batch_layout
from .batcher import Batcher, Closed, retry_alone
from .requests import Request, Signature, join, split

__all__ = ["Runner", "RuntimeConfig"]


@dataclass
class RuntimeConfig:
    """How a ``Runner`` queues and batches requests.

    Attributes:
        timeout_ns: how long a batch waits for more requests once its first one arrived, in
            nanoseconds or a ``datetime.timedelta`` (PopRT's ``timeout_ns``, default 5 ms);
            0 runs with whatever has arrived.
        max_queue: requests that may wait; beyond it ``execute_async`` waits up to
            ``submit_timeout_s`` for room, then raises.
        max_in_flight: model calls that may run at once (feeder threads); 3 keeps a load /
            compute / store pipeline full.
        submit_timeout_s: how long a caller waits for room in a full queue.
        micro_batch_size: rows per micro-batch; default the compiled model's, else the first
            request's rows.
    """

    timeout_ns: int | datetime.timedelta = 5_000_000
    max_queue: int = 64
    max_in_flight: int = 3
    submit_timeout_s: float = 10.0
    micro_batch_size: int | None = None

    def timeout_s(self) -> float:
        """``timeout_ns`` in seconds."""
        if isinstance(self.timeout_ns, datetime.timedelta):
            return self.timeout_ns.total_seconds()
        return self.timeout_ns / 1e9


class Runner:
    """Serve ``model`` (an ``inferenceModel``) to concurrent callers.

    Args:
        model: a ``poptorch.inferenceModel`` with ``OutputMode.All`` (the default) and no
            input replica grouping.
        config: queueing and batching (``RuntimeConfig()`` when omitted).

    Raises:
        Error: ``model`` is not an inference model, or its output mode is not All.

    >>> with Runner(poptorch.inferenceModel(model)) as runner:  # doctest: +SKIP
    ...     y = runner.execute(x)                         # any thread
    ...     future = runner.execute_async(x)              # a concurrent.futures.Future
    """

    def __init__(self, model: PoplarExecutor, config: RuntimeConfig | None = None) -> None:
        self.config = config = config or RuntimeConfig()
        _check_model(model)
        if config.max_queue < 1 or config.max_in_flight < 1:
            raise Error(
                f"max_queue and max_in_flight must be at least 1, got {config.max_queue} and "
                f"{config.max_in_flight}"
            )
        self.model = model
        self.slots = batch_layout(model.options, False).micro_batches
        self._signature: Signature | None = None
        self._sign_lock = threading.Lock()
        self._batcher = Batcher(
            _Slots(self),
            max_queue=config.max_queue,
            timeout_s=config.timeout_s(),
            max_held=1,  # a request that does not fit opens the next batch at once
            on_failure=retry_alone,
            feeders=config.max_in_flight,
            name="poptorch_sim feeder",
            drain=False,
        )

    # -- callers ----------------------------------------------------------------------------------

    def execute_async(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue one request (the arguments of ``model(...)``) and return its future.

        The future's result is the model's output for the request's rows only.

        Raises:
            Error: the request does not fit the runner (bad rows, dtype, structure), the queue
                stayed full for ``submit_timeout_s``, or the runner is closed.
        """
        if self._batcher.stop.is_set():
            raise _closed()
        bound = self.model._parser(args, kwargs)
        request = Request(bound, self._signature_for(bound).check(bound))
        try:
            self._batcher.submit(request, self.config.submit_timeout_s)
        except Closed:
            raise _closed() from None
        except queue.Full:
            raise Error(
                f"the request queue is full ({self.config.max_queue} requests waiting for "
                f"{self.config.submit_timeout_s} s): raise RuntimeConfig.max_queue or feed "
                "fewer requests at once"
            ) from None
        return request.future

    executeAsync = execute_async  # PopRT 1.1's name

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Run one request and wait for its outputs (thread-safe; blocks the caller).

        Raises:
            Error: as ``execute_async``; or whatever the model raised for this request.
        """
        return self.execute_async(*args, **kwargs).result()

    def close(self) -> None:
        """Finish the requests already taken, fail the waiting ones, join the feeders."""
        self._batcher.close(lambda: Error("the Runner was closed before this request ran"))

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _signature_for(self, bound: Any) -> Signature:
        with self._sign_lock:
            if self._signature is None:
                mb = self.config.micro_batch_size or _compiled_micro_batch(self.model, self.slots)
                self._signature = Signature(bound, mb, self.slots)
            return self._signature

    def _call(self, requests: list[Request]) -> list[Any]:
        assert self._signature is not None
        joined = join(requests, self._signature)
        return split(self.model(*joined.args, **joined.kwargs), requests, self.slots)


class _Slots:
    """``Runner``'s batches: requests fill the ``N`` micro-batch slots of one model call in
    arrival order; a cancelled request is dropped when its turn comes."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def open(self) -> _SlotBatch:
        return _SlotBatch(self.runner.slots)

    def call(self, batch: _SlotBatch) -> list[Any]:
        return self.runner._call(batch.requests)


class _SlotBatch:
    def __init__(self, slots: int) -> None:
        self.slots, self.used = slots, 0
        self.requests: list[Request] = []

    @property
    def full(self) -> bool:
        return self.used >= self.slots

    def add(self, request: Request) -> bool:
        if request.slots > self.slots - self.used:
            return False
        if request.future.running() or request.future.set_running_or_notify_cancel():
            self.requests.append(request)
            self.used += request.slots
        return True


def _closed() -> Error:
    return Error("this Runner is closed; create a new one")


def _check_model(model: Any) -> None:
    if not isinstance(model, PoplarExecutor) or model._training:
        raise Error(
            f"Runner serves a poptorch.inferenceModel, got {type(model).__name__}"
            + (" (a trainingModel)" if isinstance(model, PoplarExecutor) else "")
        )
    options = model.options
    if OutputMode(options.output_mode) != OutputMode.All:
        raise Error(
            f"Runner needs OutputMode.All to hand each request its rows; the model has "
            f"{OutputMode(options.output_mode).name}: leave the output mode at its default"
        )
    if options.input_group_size != 1:
        raise Error(
            "Runner does not support inputReplicaGrouping (replicas sharing inputs): got "
            f"input_group_size={options.input_group_size}"
        )


def _compiled_micro_batch(model: PoplarExecutor, slots: int) -> int | None:
    if not model.isCompiled():
        return None
    batch = compiled_batch(model)
    return batch // slots if batch is not None else None
