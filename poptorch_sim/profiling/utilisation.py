"""Utilisation over time of each trace track (load / compute / store per IPU), and its plot.

The execution trace says when each action ran; this module bins those spans into equal time
slices and reports which fraction of each slice a track was busy. With overlapped IO the plot
shows the three phases of a pipeline busy at the same time, where without it they take turns.
"""

from __future__ import annotations

from pathlib import Path

from .trace import TraceEvent, TraceRecorder

__all__ = ["utilisation", "busy_fraction", "plot_utilisation", "write_report"]


def _label(e: TraceEvent) -> str:
    return f"IPU {e.ipu} {e.track or e.category}"


def utilisation(
    events: list[TraceEvent], bins: int = 50
) -> tuple[list[float], dict[str, list[float]]]:
    """Busy fraction of every track in ``bins`` equal slices of the traced time.

    Args:
        events: trace events (``TraceRecorder.events``).
        bins: number of time slices.

    Returns:
        The slice centres in milliseconds, and per track label (``"IPU 0 load"``) the fraction
        (0–1) of each slice the track was busy.

    >>> from poptorch_sim.profiling.trace import TraceEvent
    >>> compute = TraceEvent(0, "C0", "compute", 0.0, 500.0, track="compute")
    >>> store = TraceEvent(0, "S0", "store", 500.0, 250.0, track="store")
    >>> utilisation([compute, store], 3)[1]
    {'IPU 0 compute': [1.0, 1.0, 0.0], 'IPU 0 store': [0.0, 0.0, 1.0]}
    """
    if not events:
        return [], {}
    start = min(e.start_us for e in events)
    span = max(e.end_us for e in events) - start or 1.0
    width = span / bins
    busy: dict[str, list[float]] = {}
    for e in events:
        row = busy.setdefault(_label(e), [0.0] * bins)
        first = int((e.start_us - start) / width)
        for b in range(max(0, first), min(bins, int((e.end_us - start) / width) + 1)):
            lo, hi = start + b * width, start + (b + 1) * width
            row[b] += max(0.0, min(hi, e.end_us) - max(lo, e.start_us)) / width
    times = [(start + (b + 0.5) * width) / 1e3 for b in range(bins)]
    return times, {k: [min(1.0, v) for v in row] for k, row in sorted(busy.items())}


def busy_fraction(events: list[TraceEvent]) -> dict[str, float]:
    """Per track, the fraction of the whole traced time it was busy."""
    if not events:
        return {}
    start = min(e.start_us for e in events)
    span = max(e.end_us for e in events) - start or 1.0
    totals: dict[str, float] = {}
    for e in events:
        totals[_label(e)] = totals.get(_label(e), 0.0) + e.dur_us
    return {k: v / span for k, v in sorted(totals.items())}


def plot_utilisation(events: list[TraceEvent], path: str | Path, bins: int = 50) -> Path:
    """Write a PNG line plot of every track's utilisation over time (matplotlib).

    Returns:
        The path written.
    """
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, safe off the main thread

    times, busy = utilisation(events, bins)
    fig = Figure(figsize=(8, 3.5))
    ax = fig.subplots()
    for label, row in busy.items():
        ax.plot(times, [100 * v for v in row], label=label)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("busy (%)")
    ax.set_ylim(0, 105)
    ax.set_title("poptorch_sim utilisation per track")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    return target


def write_report(trace: TraceRecorder, path: str) -> None:
    """Write the trace (Chrome-trace JSON) and its utilisation plot beside it (``.png``)."""
    written = trace.write(path)
    plot = plot_utilisation(trace.events, written.with_suffix(".png"))
    print(f"poptorch_sim: utilisation plot written to {plot}")
