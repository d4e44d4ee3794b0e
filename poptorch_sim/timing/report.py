"""The time report: predicted seconds per call per IPU, printed as a table and drawn as a Gantt chart."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CATEGORIES", "POPVISION", "IpuTime", "TimeReport"]

# Where an IPU's time goes, in the order of the table's columns.
CATEGORIES = (
    "compute", "exchange", "ipu_copies", "host_io", "sync", "weight_update", "all_reduce", "idle",
)  # fmt: skip

# PopVision's words for them (its execution trace and summary).
POPVISION = {
    "compute": "OnTileExecute",
    "exchange": "DoExchange",
    "ipu_copies": "GlobalExchange",
    "host_io": "StreamCopy",
    "sync": "Sync",
    "weight_update": "WeightUpdate",
    "all_reduce": "AllReduce",
    "idle": "Idle",
}


@dataclass(frozen=True)
class IpuTime:
    """Where one IPU of one replica spends a call, in seconds (they add up to the call).

    Attributes:
        ipu: the IPU (of replica 0).
        stages: the stages it runs.
        compute: compute sets (OnTileExecute) of forward, backward and recomputation.
        exchange: tile-to-tile exchange (DoExchange) of those ops' operands.
        ipu_copies: copies to and from other IPUs (global exchange).
        host_io: host copies (StreamCopy) not hidden by IO tiles.
        sync: BSP syncs and superstep overheads.
        weight_update: the optimizer steps (optimizer state streamed in and out when off chip).
        all_reduce: the gradient all-reduce over replicas and instances.
        idle: waiting for other IPUs (pipeline fill and flush, a slower stage, sharding).
    """

    ipu: int
    stages: tuple[int, ...]
    compute: float
    exchange: float
    ipu_copies: float
    host_io: float
    sync: float
    weight_update: float
    all_reduce: float
    idle: float

    @property
    def busy(self) -> float:
        """Everything but ``idle``."""
        return sum(getattr(self, c) for c in CATEGORIES if c != "idle")


@dataclass(frozen=True)
class TimeReport:
    """The predicted time of one call of a compiled model (see ``poptorch_sim.time_report``).

    Attributes:
        ipu_version: 2 (Mk2) or 21 (Bow), as ``useOfflineIpuTarget`` numbers them.
        hardware: the IPU's name.
        clock_hz: its clock.
        run_seconds: one call (device iterations × a step).
        samples_per_second: samples of every replica of every instance per second.
        pipeline_cycles: cycles of one step's schedule (GA + 2(N - 1) for a pipeline).
        bottleneck: the busiest IPU and what keeps it busiest.
        bubble_fraction: the share of the schedule's cycles that fill and flush the pipeline.
        ipus: per IPU of one replica, where the call's time goes.
        mode: ``pipelined``, ``sharded``, ``phased`` or ``single IPU``.
        micro_batches: micro-batches per step (GA; inference: per call).
        settings: the options that shaped the estimate.
        unknown_ops: ops the cost model does not know (counted as memory-bound).
        notes: what the estimate assumed.
        seconds: how long the estimate took.
        stages: ``(stage, ipu, forward seconds, copy seconds)`` of one micro-batch, per stage
            (what the Gantt chart lays out).
    """

    ipu_version: int
    hardware: str
    clock_hz: float
    run_seconds: float
    samples_per_second: float
    pipeline_cycles: int
    bottleneck: str
    bubble_fraction: float
    ipus: list[IpuTime]
    mode: str = "pipelined"
    micro_batches: int = 1
    settings: dict[str, Any] = field(default_factory=dict)
    unknown_ops: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stages: list[tuple[int, int, float, float]] = field(default_factory=list)

    @property
    def cycles(self) -> int:
        """The call in cycles of one tile of the first IPU, as PopART counts them."""
        return int(round(self.run_seconds * self.clock_hz))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "cycles": self.cycles}

    def __str__(self) -> str:
        head = ["IPU", "stages", *(POPVISION[c] for c in CATEGORIES)]
        rows = [
            [str(t.ipu), ",".join(map(str, t.stages)) or "-",
             *(_ms(getattr(t, c)) for c in CATEGORIES)]
            for t in self.ipus
        ]  # fmt: skip
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [
            f"Time per call (prediction for {self.hardware} IPUs at {self.clock_hz / 1e9:.3f} GHz; "
            f"{self.mode}, {self.micro_batches} micro-batch(es) per step, {self.pipeline_cycles} "
            f"cycles of the schedule; {_settings(self.settings)})",
            f"call: {_ms(self.run_seconds)} ({self.cycles:,} IPU cycles), "
            f"{self.samples_per_second:,.1f} samples/s, bottleneck {self.bottleneck}, "
            f"pipeline bubble {100 * self.bubble_fraction:.1f}%",
            "  ".join(h.ljust(w) for h, w in zip(head, widths)),
        ]
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """Draw a Gantt chart of one optimizer step per IPU into ``path`` (PNG, SVG, PDF).

        Returns:
            ``path``.
        """
        from .plot import plot_report

        plot_report(self, path)
        return path


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())
