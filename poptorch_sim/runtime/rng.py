"""A compiled model's random stream, and the per-micro-batch streams its random ops draw from.

[Note: a random stream per model]
PopTorch keeps the random-number state of each compiled model on its device: host draws
(``torch.randn`` for data augmentation) do not move it, two models do not draw from each other's,
and ``rng_state`` reads and writes it. torch's random ops draw from one process-wide default
generator per device (no generator can be scoped to a thread), so the simulator keeps each
model's state itself and lends it to torch's default generators only while the model's random
ops run:

    ModelRng (per compiled model: seed + a torch.Generator)
       │  each call draws one seed per micro-batch, in call order (device iteration,
       │  gradient accumulation step, replica)
       ▼
    MicroBatchStream (per micro-batch)      stage 0 F ──► stage 1 F ──► ... (one stream, in
       │                                     stage order, as eager computes the forward)
       ▼
    drawing(device): under one process-wide lock, torch's CPU generator (and the CUDA one of
    the stage's device) is set to the micro-batch's state, the stage's forward runs, the
    advanced state is kept for the next stage, and torch's generators are put back.

So the numbers a micro-batch draws depend on the model's seed, the call and the micro-batch,
never on which thread ran when: eager, sharded and pipelined runs of one model draw the same
masks, and a recomputed forward replays the state its forward started from. Only the forwards
of stages that draw hold the lock (their backward does not draw), so stages without random ops
still overlap freely. Where the stages of one micro-batch do not follow each other (a stage that
draws takes no value, directly or not, from an earlier stage that draws), each stage draws from
its own stream, derived from the micro-batch's seed and the stage index.

Simulated: the host's stream is left as it was after a call, but a host thread that draws random
numbers *while* another thread's call is running a random op may see the model's state (torch
has one default generator per device).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import NamedTuple

import torch

__all__ = [
    "MicroBatchStream",
    "ModelRng",
    "RngState",
    "held",
    "replaying",
    "rng_lock",
    "swapped",
]

_LOCK = threading.RLock()  # held while torch's default generators hold a model's state
_SEED_LIMIT = 1 << 62


def rng_lock() -> threading.RLock:
    """The process-wide lock under which torch's default generators may be swapped."""
    return _LOCK


class RngState(NamedTuple):
    """The states of torch's generators for one stream: the CPU one, and the CUDA one of the
    device a stage computes on (None on the CPU)."""

    cpu: torch.Tensor
    cuda: torch.Tensor | None


@contextlib.contextmanager
def swapped(state: RngState, device: torch.device) -> Iterator[list[RngState]]:
    """Set torch's default generators (CPU, and ``device``'s if CUDA) to ``state``; on exit
    put the caller's back. Yields a list that holds the state reached, once the block ends.

    The caller holds ``rng_lock()``.
    """
    cuda = device.type == "cuda" and state.cuda is not None
    host = RngState(torch.get_rng_state(), torch.cuda.get_rng_state(device) if cuda else None)
    reached: list[RngState] = []
    torch.set_rng_state(state.cpu)
    if cuda:
        torch.cuda.set_rng_state(state.cuda, device)  # type: ignore[arg-type]
    try:
        yield reached
    finally:
        reached.append(
            RngState(torch.get_rng_state(), torch.cuda.get_rng_state(device) if cuda else None)
        )
        torch.set_rng_state(host.cpu)
        if cuda:
            torch.cuda.set_rng_state(host.cuda, device)  # type: ignore[arg-type]


def _fresh(seed: int, device: torch.device) -> torch.Tensor:
    return torch.Generator(device=device).manual_seed(seed).get_state()


class MicroBatchStream:
    """The random stream of one micro-batch; each stage it passes through draws in turn.

    Args:
        seed: the micro-batch's seed (drawn from the model's stream).
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._states: dict[int, RngState] = {}  # per key (see ``drawing``)

    def state(self, device: torch.device, key: int = 0) -> RngState:
        """The state the next draw of stream ``key`` on ``device`` starts from."""
        seed = self.seed if key == 0 else (self.seed * 1_000_003 + key) % _SEED_LIMIT
        state = self._states.get(key)
        if state is None:
            state = RngState(_fresh(seed, torch.device("cpu")), None)
        if device.type == "cuda" and state.cuda is None:
            state = RngState(state.cpu, _fresh(seed, device))
        return state

    @contextlib.contextmanager
    def drawing(self, device: torch.device, key: int = 0) -> Iterator[RngState]:
        """Run the block's random ops on this stream (under ``rng_lock()``); yields the state
        they start from (what a recomputation replays with ``replaying``).

        ``key`` 0 is the micro-batch's stream; a stage that does not follow the earlier
        stages that draw uses its own (its index; See [Note: a random stream per model]).
        """
        with _LOCK:
            start = self.state(device, key)
            with swapped(start, device) as reached:
                yield start
            self._states[key] = reached[0]


@contextlib.contextmanager
def held(device: torch.device) -> Iterator[RngState]:
    """Draw from torch's own generators (no model stream given) under ``rng_lock()``; yields
    their state at the start (what a recomputation replays)."""
    with _LOCK:
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        yield RngState(torch.get_rng_state(), cuda)


@contextlib.contextmanager
def replaying(state: RngState, device: torch.device) -> Iterator[None]:
    """Draw again from ``state`` (a recomputed forward), leaving every stream as it was."""
    with _LOCK, swapped(state, device):
        yield


class ModelRng:
    """A compiled model's random stream: PopTorch's device RNG (``randomSeed``, ``rng_state``).

    Args:
        seed: ``Options.randomSeed``; None starts from a copy of torch's CPU generator as it
            stands (without drawing from it), so ``torch.manual_seed`` makes runs repeat.

    >>> rng = ModelRng(42)
    >>> rng.state()[0]
    42
    """

    def __init__(self, seed: int | None = None) -> None:
        self._generator = torch.Generator()
        self._lock = threading.Lock()  # concurrent calls (overlapped IO) draw their seeds here
        self.seed = 0
        if seed is None:
            self._generator.set_state(torch.get_rng_state())
            self.seed = torch.initial_seed()
        else:
            self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """Start the stream again from ``seed``."""
        with self._lock:
            self.seed = int(seed)
            self._generator.manual_seed(self.seed)

    def state(self) -> list[int]:
        """``[seed] + state``, as ``PoplarExecutor.rng_state`` returns it."""
        with self._lock:
            return [self.seed, *self._generator.get_state().tolist()]

    def set_state(self, state: list[int]) -> None:
        """Set from ``state()``'s list; ``[seed]`` alone reseeds (as PopTorch's setter does).

        Raises:
            ValueError: the list is empty, or its state part is not one ``state()`` returned.
        """
        if not state:
            raise ValueError("rng_state must be [seed] + state, as rng_state returned it; got []")
        if len(state) == 1:
            self.reseed(state[0])
            return
        with self._lock:
            try:
                self._generator.set_state(torch.tensor(state[1:], dtype=torch.uint8))
            except (RuntimeError, OverflowError) as exc:
                raise ValueError(
                    f"rng_state: the state part ({len(state) - 1} values) is not one that "
                    f"rng_state returned: {exc}"
                ) from exc
            self.seed = int(state[0])

    def streams(self, count: int) -> list[MicroBatchStream]:
        """One stream per micro-batch of a call, in call order; advances the model's stream."""
        if count == 0:
            return []
        with self._lock:
            seeds = torch.randint(0, _SEED_LIMIT, (count,), generator=self._generator)
        return [MicroBatchStream(int(s)) for s in seeds.tolist()]

    def __getstate__(self) -> dict[str, object]:
        return {"seed": self.seed, "state": self._generator.get_state()}

    def __setstate__(self, data: dict[str, object]) -> None:
        self._generator = torch.Generator()
        self._generator.set_state(data["state"])  # type: ignore[arg-type]
        self._lock = threading.Lock()
        self.seed = int(data["seed"])  # type: ignore[call-overload]
