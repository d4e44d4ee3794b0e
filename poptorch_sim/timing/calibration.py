"""The time model's calibrated parameters: what no datasheet gives, each with the data it was fitted on.

[Note: calibration]
Two numbers are fitted, by ``python benchmarks/ipu_time.py --fit``, on the four MLPerf Training
rows of ``benchmarks/ipu_time.py`` (Graphcore, closed division, IPU-POD16 Mk2: BERT-Large v1.0
and v1.1, ResNet-50 v1.0 and v1.1) and on nothing else; two more are set, not fitted, because
four rows of two models cannot tell them apart from the fitted two:

=====================  ========================================================================
parameter              what it stands for
=====================  ========================================================================
amp_efficiency         fitted (BERT-Large rows): the fraction of the AMP's peak that matmuls
                       reach (tile imbalance, vertex overheads, partials): a matmul takes
                       FLOPs / (peak × amp_efficiency)
conv_efficiency        fitted (ResNet-50 rows): the same for convolutions, which use the AMP
                       less well (few channels in early layers, strided and 1×1 shapes)
memory_efficiency      set to 0.5: the fraction of the on-tile memory bandwidth that
                       memory-bound ops (pointwise, norms, reductions, copies) reach
superstep_cycles       set to 1000: cycles each costing op adds for its BSP supersteps beyond
                       its compute and exchange (sync, exchange setup, control code); no
                       published figure for Mk2 (arXiv:1912.03413 measures Mk1 exchange, not a
                       whole superstep)
=====================  ========================================================================

benchmarks/RESULTS.md has the fit and the errors, and the errors on eight more MLPerf rows the
parameters were never fitted on (``VALIDATION`` in ``benchmarks/published``: IPU-POD64 Mk2 and
Bow Pod16 / Pod64; mean 8.5%, one row over 20%).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CALIBRATION", "Calibration"]


@dataclass(frozen=True)
class Calibration:
    """The model's parameters (see [Note: calibration])."""

    amp_efficiency: float
    conv_efficiency: float
    memory_efficiency: float = 0.5
    superstep_cycles: float = 1000.0


# See [Note: calibration]: fitted on the four MLPerf rows only.
CALIBRATION = Calibration(amp_efficiency=0.4, conv_efficiency=0.3)
