"""Execution trace of the IPU workers: timestamped actions, Chrome-trace JSON and a stage summary.

Every action a worker runs (fwd/bwd of a stage on a micro-batch, transfers, optimizer steps) is
one event on the track of its IPU. ``TraceRecorder.write`` produces the Chrome trace event format
(a JSON object with ``traceEvents``), which https://ui.perfetto.dev and ``chrome://tracing`` open:
one thread track per IPU, ``"ph": "X"`` complete events with ``ts``/``dur`` in microseconds.
Events with a ``track`` (overlapped IO's ``load`` and ``store``) get a track of their own beside
their IPU's (``IPU 0 load``), so PopVision-style overlap of IO and compute shows. A model's
predicted IPU time (``poptorch_sim.timing``) adds one step per IPU as a second process,
"predicted IPU time", beside the host's tracks.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TraceEvent", "TraceRecorder"]

_PID = 0
_PREDICTED_PID = 1
_CATEGORIES = ("fwd", "bwd", "step", "send", "recv")
_MARKS = {"fwd": "F", "bwd": "B", "step": "S"}


@dataclass(frozen=True)
class TraceEvent:
    """One completed action on one IPU; times in microseconds since the recorder started."""

    ipu: int
    name: str
    category: str
    start_us: float
    dur_us: float
    stage: int | None = None
    mb: int | None = None
    track: str = ""  # "" = the IPU's own track; else e.g. "load", "store"

    @property
    def end_us(self) -> float:
        """When the action finished."""
        return self.start_us + self.dur_us


class TraceRecorder:
    """Collects ``TraceEvent`` from any thread.

    >>> rec = TraceRecorder()
    >>> with rec.span(0, "0F0", "fwd", stage=0, mb=0):
    ...     pass
    >>> [e.name for e in rec.events]
    ['0F0']
    """

    def __init__(self) -> None:
        # Counters with one value for the whole trace (e.g. memory per IPU), at time 0.
        self.static_counters: list[tuple[str, dict[str, float]]] = []
        # Predicted tracks: per track name, (start us, duration us, what) from time 0.
        self.predicted: dict[str, list[tuple[float, float, str]]] = {}
        self._origin_ns = time.perf_counter_ns()
        self._events: list[TraceEvent] = []
        self._counters: list[tuple[float, int, str, float]] = []  # (us, IPU, name, value)
        self._lock = threading.Lock()

    def now_ns(self) -> int:
        """The clock events are measured with (``time.perf_counter_ns``)."""
        return time.perf_counter_ns()

    def record(
        self,
        ipu: int,
        name: str,
        category: str,
        start_ns: int,
        end_ns: int,
        *,
        stage: int | None = None,
        mb: int | None = None,
        track: str = "",
    ) -> None:
        """Add an event that ran from ``start_ns`` to ``end_ns`` (``now_ns`` clock)."""
        event = TraceEvent(
            ipu,
            name,
            category,
            (start_ns - self._origin_ns) / 1e3,
            (end_ns - start_ns) / 1e3,
            stage,
            mb,
            track,
        )
        with self._lock:
            self._events.append(event)

    def count(self, ipu: int, name: str, value: float) -> None:
        """Record that IPU ``ipu``'s counter ``name`` (e.g. its intra-op ``threads``) is
        ``value`` from now on; Perfetto shows it as the counter track ``IPU <ipu> <name>``."""
        at_us = (time.perf_counter_ns() - self._origin_ns) / 1e3
        with self._lock:
            self._counters.append((at_us, ipu, name, value))

    @property
    def counters(self) -> list[tuple[float, int, str, float]]:
        """A snapshot of the counter values recorded so far: ``(us, IPU, name, value)``."""
        with self._lock:
            return sorted(self._counters)

    @contextmanager
    def span(
        self,
        ipu: int,
        name: str,
        category: str,
        *,
        stage: int | None = None,
        mb: int | None = None,
        track: str = "",
    ) -> Iterator[None]:
        """Record the time spent inside the ``with`` block as one event."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            end = time.perf_counter_ns()
            self.record(ipu, name, category, start, end, stage=stage, mb=mb, track=track)

    @property
    def events(self) -> list[TraceEvent]:
        """A snapshot of the events so far, ordered by start time."""
        with self._lock:
            return sorted(self._events, key=lambda e: (e.start_us, e.ipu))

    def clear(self) -> None:
        """Forget every event (the clock origin is kept)."""
        with self._lock:
            self._events.clear()
            self._counters.clear()

    def to_chrome(self) -> dict[str, Any]:
        """The events in Chrome trace event format, one named thread track per IPU."""
        events = self.events
        tids = _track_ids(events)
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": _PID, "args": {"name": "poptorch_sim"}}
        ]
        for (ipu, track), tid in tids.items():
            name = f"IPU {ipu} {track}" if track else f"IPU {ipu}"
            meta.append(
                {"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid, "args": {"name": name}}
            )
            meta.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": _PID,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        complete = [
            {
                "name": e.name,
                "cat": e.category,
                "ph": "X",
                "ts": round(e.start_us, 3),
                "dur": round(e.dur_us, 3),
                "pid": _PID,
                "tid": tids[(e.ipu, e.track)],
                "args": {"stage": e.stage, "mb": e.mb},
            }
            for e in events
        ]
        counters = [
            {"name": name, "ph": "C", "ts": 0, "pid": _PID, "args": values}
            for name, values in self.static_counters
        ] + [
            {
                "name": f"IPU {ipu} {name}",
                "ph": "C",
                "ts": round(at_us, 3),
                "pid": _PID,
                "args": {name: value},
            }
            for at_us, ipu, name, value in self.counters
        ]
        return {
            "traceEvents": meta + complete + counters + self._predicted_events(),
            "displayTimeUnit": "ms",
        }

    def _predicted_events(self) -> list[dict[str, Any]]:
        if not self.predicted:
            return []
        out: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": _PREDICTED_PID,
                                      "args": {"name": "predicted IPU time"}}]  # fmt: skip
        for tid, (track, bars) in enumerate(self.predicted.items()):
            out.append({"name": "thread_name", "ph": "M", "pid": _PREDICTED_PID, "tid": tid,
                        "args": {"name": track}})  # fmt: skip
            out += [
                {"name": what, "cat": "predicted", "ph": "X", "ts": round(start, 3),
                 "dur": round(length, 3), "pid": _PREDICTED_PID, "tid": tid}
                for start, length, what in bars
            ]  # fmt: skip
        return out

    def write(self, path: str | Path) -> Path:
        """Write the Chrome-trace JSON to ``path`` and print where it went.

        Returns:
            The path written.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_chrome()))
        print(f"poptorch_sim: execution trace written to {target} (open it in ui.perfetto.dev)")
        return target

    def stage_times(self) -> dict[int, dict[str, float]]:
        """Total milliseconds per stage and category (``fwd``, ``bwd``, ``step``, ...)."""
        totals: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_CATEGORIES, 0.0))
        for e in self.events:
            if e.stage is not None:
                totals[e.stage][e.category] = totals[e.stage].get(e.category, 0.0) + e.dur_us / 1e3
        return dict(sorted(totals.items()))

    def timeline(self, width: int = 80) -> str:
        """An ASCII Gantt chart: one row per IPU, ``F``/``B``/``S`` where fwd/bwd/step ran.

        >>> rec, t = TraceRecorder(), 0
        >>> rec.record(0, "0F0", "fwd", t, t + 2000, stage=0, mb=0)
        >>> rec.record(1, "1F0", "fwd", t + 1000, t + 3000, stage=1, mb=0)
        >>> print(rec.timeline(width=6))
        IPU 0 |FFFF..|
        IPU 1 |..FFFF|
        """
        events = [e for e in self.events if e.category in _MARKS]
        if not events:
            return ""
        start = min(e.start_us for e in events)
        span = max(e.end_us for e in events) - start or 1.0
        rows = {ipu: ["."] * width for ipu in sorted({e.ipu for e in events})}
        for e in events:
            first = int((e.start_us - start) / span * width)
            last = max(first + 1, round((e.end_us - start) / span * width))
            for col in range(first, min(last, width)):
                rows[e.ipu][col] = _MARKS[e.category]
        return "\n".join(f"IPU {ipu} |{''.join(cells)}|" for ipu, cells in rows.items())

    def summary(self) -> str:
        """A per-stage time table (ms) with each stage's compute share, so imbalance shows.

        ``recv`` is time spent waiting for activations or gradients (pipeline bubbles).
        """
        times = self.stage_times()
        head = f"{'stage':>5} " + " ".join(f"{c:>9}" for c in _CATEGORIES) + f" {'compute':>9}"
        lines = [head]
        compute = {s: t["fwd"] + t["bwd"] + t["step"] for s, t in times.items()}
        for stage, t in times.items():
            cells = " ".join(f"{t[c]:9.2f}" for c in _CATEGORIES)
            lines.append(f"{stage:>5} {cells} {compute[stage]:9.2f}")
        if compute and min(compute.values()) > 0:
            ratio = max(compute.values()) / min(compute.values())
            lines.append(f"imbalance (slowest / fastest stage compute): {ratio:.2f}x")
        return "\n".join(lines)


_TRACK_ORDER = {"load": 0, "": 1, "compute": 1, "store": 2}


def _track_ids(events: list[TraceEvent]) -> dict[tuple[int, str], int]:
    """A thread id per (IPU, track): IPU ``i``'s own track keeps tid ``i`` when it has no
    IO tracks (traces without overlapped IO look as before); with them, load / IPU / store of
    each IPU sit next to each other."""
    keys = sorted(
        {(e.ipu, e.track) for e in events}, key=lambda k: (k[0], _TRACK_ORDER.get(k[1], 3), k[1])
    )
    if all(track == "" for _, track in keys):
        return {key: key[0] for key in keys}
    return {key: i for i, key in enumerate(keys)}
