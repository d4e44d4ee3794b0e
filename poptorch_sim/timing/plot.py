"""A Gantt chart of one optimizer step per IPU: forward, recompute, backward, copies, update."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report import TimeReport

__all__ = ["plot_report", "timeline"]

_COLOURS = {
    "forward": "#4c72b0",
    "recompute": "#8172b3",
    "backward": "#dd8452",
    "copies": "#937860",
    "weight update": "#55a868",
    "all-reduce": "#c44e52",
}

Bar = tuple[float, float, str]  # start, duration (seconds), what


def _passes(report: TimeReport) -> tuple[bool, bool]:
    return bool(report.settings.get("training")), bool(report.settings.get("recomputation"))


def _micro_batch(report: TimeReport, ipu: int, k: int, bars: list[Bar], t: float) -> float:
    """One pipeline cycle ``k`` of ``ipu``: its stages' forwards, then their backwards."""
    training, recompute = _passes(report)
    n, ga = len(report.stages), report.micro_batches
    mine = [st for st in report.stages if st[1] == ipu]
    for s, _, fwd, copy in mine:
        if 0 <= k - s < ga:
            bars.append((t, fwd, "forward"))
            t += fwd
            if copy and not training:
                bars.append((t, copy, "copies"))
                t += copy
    if training:
        for s, _, fwd, copy in reversed(mine):
            if 0 <= k - (2 * (n - 1) - s) < ga:
                if recompute:
                    bars.append((t, fwd, "recompute"))
                    t += fwd
                bars.append((t, 2 * fwd, "backward"))
                t += 2 * fwd
                if copy:
                    bars.append((t, copy, "copies"))
                    t += copy
    return t


def _one_at_a_time(report: TimeReport, bars: dict[int, list[Bar]]) -> float:
    """Sharded: each micro-batch through the IPUs in turn, forward then backward."""
    training, recompute = _passes(report)
    end = 0.0
    for _ in range(report.micro_batches):
        for _s, ipu, fwd, copy in report.stages:
            bars[ipu].append((end, fwd, "forward"))
            end += fwd + copy
        for _s, ipu, fwd, copy in reversed(report.stages if training else []):
            bars[ipu].append((end, fwd * (2 + recompute), "backward"))
            end += fwd * (2 + recompute) + copy
    return end


def timeline(report: TimeReport) -> dict[int, list[Bar]]:
    """Per IPU, the bars of one optimizer step (or one inference call) of ``report``."""
    training, recompute = _passes(report)
    ipus = sorted({ipu for _, ipu, _, _ in report.stages})
    bars: dict[int, list[Bar]] = {i: [] for i in ipus}
    factor = 1 + (2 + recompute if training else 0)
    work = {i: sum(f * factor + c for _, j, f, c in report.stages if j == i) for i in ipus}
    if report.mode == "pipelined" and len(report.stages) > 1:
        cycle = max(work.values())
        for k in range(report.pipeline_cycles):
            for ipu in ipus:
                _micro_batch(report, ipu, k, bars[ipu], k * cycle)
        end = report.pipeline_cycles * cycle
    else:
        end = _one_at_a_time(report, bars)
    steps = max(1, int(report.settings.get("device_iterations", 1))) if training else 1
    for t in report.ipus:
        update, reduce = t.weight_update / steps, t.all_reduce / steps
        if update:
            bars[t.ipu].append((end, update, "weight update"))
        if reduce:
            bars[t.ipu].append((end + update, reduce, "all-reduce"))
    return bars


def plot_report(report: TimeReport, path: str) -> None:
    """Write the Gantt chart of ``report`` to ``path`` (format from its extension)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    bars = timeline(report)
    fig = Figure(figsize=(10, 1.2 + 0.6 * len(bars)))
    ax = fig.subplots()
    for row, (_ipu, items) in enumerate(sorted(bars.items())):
        for what in _COLOURS:
            spans = [(1e3 * start, 1e3 * length) for start, length, w in items if w == what]
            if spans:
                ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=_COLOURS[what])
    ax.set_yticks(range(len(bars)), [f"IPU {i}" for i in sorted(bars)])
    ax.invert_yaxis()
    ax.set_xlabel("ms (predicted)")
    ax.set_title(
        f"One step on {report.hardware} IPUs: {report.mode}, {report.micro_batches} "
        f"micro-batches, {report.pipeline_cycles} cycles (prediction)",
        fontsize="medium",
    )
    ax.legend(handles=[Patch(color=c, label=w) for w, c in _COLOURS.items()],
              fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
