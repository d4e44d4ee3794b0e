"""Stacked bars of each IPU's memory by category against its limit (matplotlib, Agg)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .report import CATEGORIES

if TYPE_CHECKING:
    from .report import MemoryReport

__all__ = ["plot_report"]

_COLOURS = {
    "weights": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_state": "#55a868",
    "activations": "#c44e52",
    "allowance": "#b0b0b0",
}


def plot_report(report: MemoryReport, path: str) -> None:
    """Write the figure of ``report`` to ``path`` (format from its extension)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    mib = 1024.0 * 1024.0
    fig = Figure(figsize=(3.5 + 0.8 * len(report.ipus), 4.2))
    ax = fig.subplots()
    xs = list(range(len(report.ipus)))
    bottom = [0.0] * len(xs)
    for category in CATEGORIES:
        heights = [getattr(m, category) / mib for m in report.ipus]
        ax.bar(xs, heights, bottom=bottom, color=_COLOURS[category],
               label=category.replace("_", " "))  # fmt: skip
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, m in zip(xs, report.ipus):
        ax.hlines(m.limit / mib, x - 0.45, x + 0.45, colors="black", linestyles="dashed")
    ax.set_xticks(xs, [f"IPU {m.ipu}" for m in report.ipus])
    ax.set_ylabel("MiB")
    ax.set_title(
        f"Memory per IPU (dashed: limit)\n{report.schedule}, {report.micro_batches} micro-batches",
        fontsize="medium",
    )
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
