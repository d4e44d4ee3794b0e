"""The memory report: bytes per IPU and category, printed as a table and drawn as bars."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .plot import stacked_bars

__all__ = ["CATEGORIES", "IpuMemory", "MemoryReport", "format_bytes"]

# What fills an IPU, in the order of the table's columns and the plot's stacked bars.
CATEGORIES = ("weights", "gradients", "optimizer_state", "activations", "allowance")


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KiB'`` (binary units, as PopVision shows them)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


@dataclass(frozen=True)
class IpuMemory:
    """What one IPU of one replica holds, in bytes.

    Attributes:
        ipu: the IPU (of replica 0; replica ``r`` holds the same on IPU ``r × IPUs + ipu``).
        stages: the stages it runs.
        weights: parameters and buffers of those stages.
        gradients: gradient accumulators (when gradient accumulation or replication needs them).
        optimizer_state: optimizer state kept on chip (this replica's shard under RTS).
        activations: peak bytes saved for backward over the micro-batches in flight.
        allowance: reserved for what the model cannot know (code, exchange buffers).
        limit: the IPU's memory.
        optimizer_state_off_chip: optimizer state kept in streaming memory (not in ``total``).
        optimizer_detail: ``{"<state> (<dtype>)": bytes}`` of the optimizer state, on or off chip.
        activations_per_micro_batch: per stage, bytes one micro-batch saves for backward.
        in_flight: per stage, the most micro-batches whose activations it holds at once.
    """

    ipu: int
    stages: tuple[int, ...]
    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    allowance: int
    limit: int
    optimizer_state_off_chip: int = 0
    optimizer_detail: dict[str, int] = field(default_factory=dict)
    activations_per_micro_batch: dict[int, int] = field(default_factory=dict)
    in_flight: dict[int, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Everything the IPU holds on chip (the categories, allowance included)."""
        return sum(getattr(self, c) for c in CATEGORIES)

    @property
    def fits(self) -> bool:
        """Whether ``total`` is within ``limit``."""
        return self.total <= self.limit

    def largest(self, count: int = 2) -> list[tuple[str, int]]:
        """The ``count`` largest categories, largest first."""
        pairs = sorted(((c, getattr(self, c)) for c in CATEGORIES), key=lambda p: -p[1])
        return pairs[:count]


@dataclass(frozen=True)
class MemoryReport:
    """Estimated memory of each IPU of a compiled model (see ``poptorch_sim.memory_report``).

    Attributes:
        ipus: one ``IpuMemory`` per IPU of one replica, by IPU (as PopVision's Graph Analyser
            shows a replicated program: every replica holds the same on its own IPUs, with
            ``useReplicatedTensorSharding`` each its shard of the optimizer state).
        schedule: the schedule whose micro-batches in flight the activations count.
        micro_batches: micro-batches per optimizer step on one replica (gradient accumulation).
        settings: the options that shaped the estimate (replicas, offload, RTS, recomputation).
        notes: the stated allowances and anything the estimate could not know.
        seconds: how long the estimate took.
    """

    ipus: list[IpuMemory]
    schedule: str
    micro_batches: int
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def over_limit(self) -> list[IpuMemory]:
        """The IPUs whose estimate exceeds their limit."""
        return [m for m in self.ipus if not m.fits]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (totals included)."""
        out = asdict(self)
        for ipu, entry in zip(self.ipus, out["ipus"]):
            entry["total"] = ipu.total
        return out

    def __str__(self) -> str:
        head = ["IPU", "stages", *CATEGORIES, "total", "limit", "used"]
        rows = [
            [
                str(m.ipu),
                ",".join(map(str, m.stages)) or "-",
                *(format_bytes(getattr(m, c)) for c in CATEGORIES),
                format_bytes(m.total),
                format_bytes(m.limit),
                f"{100 * m.total / m.limit:.1f}%",
            ]
            for m in self.ipus
        ]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [
            f"Memory per IPU (estimate; schedule {self.schedule}, {self.micro_batches} "
            f"micro-batch(es) per step; {_settings(self.settings)})",
            *self._replica_line(),
            "  ".join(h.ljust(w) for h, w in zip(head, widths)),
        ]
        lines += [
            "  ".join(c.rjust(w) for c, w in zip(r, widths))
            + ("" if m.fits else "  OUT OF MEMORY")
            for r, m in zip(rows, self.ipus)
        ]
        flights = [
            f"stage {s}: {format_bytes(per)} x {m.in_flight.get(s, 0)}"
            for m in self.ipus
            for s, per in sorted(m.activations_per_micro_batch.items())
        ]
        if any(m.activations for m in self.ipus):
            kept = (
                "inputs and checkpoints kept, plus the largest segment of one micro-batch "
                "recomputed in backward,"
                if self.settings.get("recomputation")
                else "saved for backward"
            )
            lines.append(f"activations ({kept} per micro-batch x micro-batches in flight): "
                         + ", ".join(flights))  # fmt: skip
        detail: dict[str, int] = {}
        for m in self.ipus:
            for name, nbytes in m.optimizer_detail.items():
                detail[name] = detail.get(name, 0) + nbytes
        if detail:
            parts = ", ".join(f"{name} {format_bytes(b)}" for name, b in detail.items())
            lines.append(f"optimizer state ({self.settings.get('optimizer')}): {parts}")
        off = sum(m.optimizer_state_off_chip for m in self.ipus)
        if off:
            lines.append(f"optimizer state off chip (streaming memory): {format_bytes(off)}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    @property
    def replicas(self) -> int:
        """The replication factor: ``ipus`` are one replica's, each replica holds the same."""
        return int(self.settings.get("replicas", 1))

    def _replica_line(self) -> list[str]:
        if self.replicas <= 1:
            return []
        n = len(self.ipus)
        rts = f" (RTS: each holds 1/{self.replicas} of the optimizer state)"
        return [
            f"per replica: {self.replicas} replicas each hold this on their own IPUs, replica r "
            f"on IPUs r x {n} + ipu ({self.replicas * n} IPUs in all)"
            + (rts if self.settings.get("RTS") else "")
        ]

    def plot(self, path: str) -> str:
        """Draw stacked bars per IPU against its limit into ``path`` (PNG, SVG, PDF).

        Returns:
            ``path``.
        """
        mib = 1024.0 * 1024.0
        stacked_bars(
            path,
            [f"IPU {m.ipu}" for m in self.ipus],
            {c: [getattr(m, c) / mib for m in self.ipus] for c in CATEGORIES},
            [m.limit / mib for m in self.ipus],
            f"Memory per IPU (dashed: limit)\n{self.schedule}, {self.micro_batches} micro-batches",
        )
        return path


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())
