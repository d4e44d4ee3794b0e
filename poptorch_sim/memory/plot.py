"""Stacked bars against a limit per bar, drawn with matplotlib (Agg): the memory report's figure.

It knows nothing of the report: ``MemoryReport.plot`` hands it the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["stacked_bars"]

_COLOURS = {
    "weights": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_state": "#55a868",
    "activations": "#c44e52",
    "allowance": "#b0b0b0",
}


def stacked_bars(
    path: str,
    labels: Sequence[str],
    stacks: dict[str, Sequence[float]],
    limits: Sequence[float],
    title: str,
    unit: str = "MiB",
) -> None:
    """Write one stacked bar per label, with a dashed line at its limit, to ``path``.

    Args:
        path: the image file (format from its extension: PNG, SVG, PDF).
        labels: the bars' names, left to right.
        stacks: per category (bottom to top, in order), one height per bar.
        limits: per bar, where its dashed line goes.
        title: the figure's title.
        unit: the y axis's unit.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.5 + 0.8 * len(labels), 4.2))
    ax = fig.subplots()
    xs = list(range(len(labels)))
    bottom = [0.0] * len(xs)
    for category, heights in stacks.items():
        ax.bar(xs, list(heights), bottom=bottom, color=_COLOURS.get(category),
               label=category.replace("_", " "))  # fmt: skip
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, limit in zip(xs, limits):
        ax.hlines(limit, x - 0.45, x + 0.45, colors="black", linestyles="dashed")
    ax.set_xticks(xs, list(labels))
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
