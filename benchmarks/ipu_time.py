"""Predicted against published IPU throughput: the time model's calibration and validation rows.

Each row is an audited MLPerf Training result of Graphcore's (closed division, IPU-POD16, Mk2;
configurations from the mlcommons training_results repositories; throughput recomputed from the
result logs, see ../shared/reference/ipu-hardware.md). The script builds each configuration,
compiles it for an offline Mk2 target (``useOfflineIpuTarget(2)``: nothing runs), reads
``poptorch_sim.time_report`` and prints predicted against published samples per second, each
row's error, and the mean and maximum error.

* BERT-Large, sequence 512, packed: 4 IPUs per replica, encoder layers [3, 7, 7, 7] (embeddings
  and the heads on IPU 0, as Graphcore's BERT places them beside the tied embedding), 4
  replicas, micro-batch 2 packs, GA 192, FP16, LAMB with its state off chip and sharded over the
  replicas (RTS), recomputation (PopTorch's default for a pipeline). The masked-LM head runs on
  the masked positions only (76 per pack, MLPerf's ``max_predictions_per_seq``). A sample is a
  pack: sequences per second = packs per second × the mean sequences per pack that the
  project's SPFHP gives on the Wikipedia length histogram (at most 3 per pack).
* ResNet-50 v1.5: one IPU per replica, 16 replicas, micro-batch 20, GA 6 (v1.0) and GA 10
  (v1.1), FP16, SGD with momentum.

``--cost`` measures what the time estimate adds to a compile, for the models of
``benchmarks/models.py`` (its FULL sizes, pipelined training): the op counting in the shared
analysis's fake forward (the analysis run again with and without it) and the estimate itself,
against the whole compile.

``--fit`` searches the fitted parameters ([Note: calibration] in
``poptorch_sim/timing/calibration.py``) on these four rows and prints the best; the rows are the
only data the model is fitted on.

Run: ``python benchmarks/ipu_time.py [--fit] [--only bert|resnet] [--cost]``
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
os.environ.setdefault("POPTORCH_SIM_OFFLINE", "1")

import poptorch_sim as poptorch  # noqa: E402
from poptorch_sim.packing import pack_histogram  # noqa: E402
from poptorch_sim.timing import CALIBRATION, Calibration  # noqa: E402
from poptorch_sim.timing.estimate import estimate  # noqa: E402
from poptorch_sim.timing.settings import time_settings  # noqa: E402

HISTOGRAM = Path(__file__).resolve().parent / "data/wikipedia_512_histogram.txt"
MAX_PREDICTIONS = 76  # MLPerf BERT's max_predictions_per_seq


@dataclass(frozen=True)
class Row:
    """One published result and the configuration it ran."""

    name: str
    model: str
    published: float  # samples (sequences, images) per second
    gradient_accumulation: int


ROWS = [
    Row("v1.0 POD16 BERT-Large", "bert", 1419.0, 192),
    Row("v1.1 POD16 BERT-Large", "bert", 1524.0, 192),
    Row("v1.0 POD16 ResNet-50", "resnet", 27527.0, 6),
    Row("v1.1 POD16 ResNet-50", "resnet", 29543.0, 10),
]


def sequences_per_pack(path: Path = HISTOGRAM) -> float:
    """Mean sequences per pack of SPFHP (at most 3 per pack) on a length histogram."""
    hist = np.loadtxt(path, dtype=np.int64)
    groups = pack_histogram(hist, len(hist), max_sequences_per_pack=3, algorithm="spfhp")
    packs = sum(g.count for g in groups)
    return sum(g.count * len(g.lengths) for g in groups) / packs


class PackedBertPretraining(nn.Module):
    """BERT-Large pretraining on packs: encoder, masked-LM head on the masked positions, NSP."""

    def __init__(self, layers: tuple[int, ...] = (3, 7, 7, 7)) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            hidden_size=1024, num_hidden_layers=sum(layers), num_attention_heads=16,
            intermediate_size=4096, max_position_embeddings=512, attn_implementation="eager",
        )  # fmt: skip
        self.bert = BertModel(config, add_pooling_layer=False)
        self.transform = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.LayerNorm(1024))
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.nsp = nn.Sequential(nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 2))
        poptorch.BeginBlock(self.bert.embeddings, "embeddings", ipu_id=0)
        start = 0
        for ipu, count in enumerate(layers):
            poptorch.BeginBlock(self.bert.encoder.layer[start], f"layers{ipu}", ipu_id=ipu)
            start += count
        poptorch.BeginBlock(self.transform, "heads", ipu_id=0)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, masked: torch.Tensor,
        labels: torch.Tensor, nsp_labels: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        hidden = self.bert(input_ids=ids, position_ids=positions).last_hidden_state
        picked = torch.gather(hidden, 1, masked.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        logits = self.transform(picked) @ self.bert.embeddings.word_embeddings.weight.t()
        mlm = nn.functional.cross_entropy(
            (logits + self.decoder_bias).float().flatten(0, 1), labels.flatten()
        )
        nsp = self.nsp(hidden[:, :3]).float().flatten(0, 1)
        loss = mlm + nn.functional.cross_entropy(nsp, nsp_labels.flatten())
        return poptorch.identity_loss(loss, reduction="none")


class ResNetTraining(nn.Module):
    """ResNet-50 v1.5 (torchvision) with its loss."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import resnet50

        self.net = resnet50()

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(images).float(), labels)


def _bert(ga: int) -> tuple[Any, tuple[torch.Tensor, ...]]:
    model = PackedBertPretraining().half()
    opts = poptorch.Options().useOfflineIpuTarget(2).replicationFactor(4)
    opts.Training.gradientAccumulation(ga)
    # the heads return to IPU 0: stages in execution order
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False).useReplicatedTensorSharding(True)
    )
    optimizer = poptorch.optim.LAMB(model.parameters(), lr=1e-3, accum_type=torch.float16)
    rows = ga * 4 * 2
    inputs = (
        torch.zeros(rows, 512, dtype=torch.long),
        torch.arange(512).repeat(rows, 1),
        torch.zeros(rows, MAX_PREDICTIONS, dtype=torch.long),
        torch.zeros(rows, MAX_PREDICTIONS, dtype=torch.long),
        torch.zeros(rows, 3, dtype=torch.long),
    )
    return poptorch.trainingModel(model, opts, optimizer), inputs


def _resnet(ga: int) -> tuple[Any, tuple[torch.Tensor, ...]]:
    model = ResNetTraining().half()
    opts = poptorch.Options().useOfflineIpuTarget(2).replicationFactor(16)
    opts.Training.gradientAccumulation(ga)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rows = ga * 16 * 20
    images = torch.empty(rows, 3, 224, 224, dtype=torch.float16)  # never read: offline
    return poptorch.trainingModel(model, opts, optimizer), (
        images, torch.zeros(rows, dtype=torch.long),
    )  # fmt: skip


@dataclass
class Compiled:
    """A compiled row: what the estimate reads, kept to re-estimate with other parameters."""

    row: Row
    analysis: Any
    settings: Any
    trainer: Any
    scale: float  # published samples per predicted sample (sequences per pack)
    compile_s: float


def compile_row(row: Row, cache: dict[tuple[str, int], Compiled]) -> Compiled:
    """Compile ``row``'s configuration offline (once per model and GA)."""
    key = (row.model, row.gradient_accumulation)
    if key not in cache:
        build = _bert if row.model == "bert" else _resnet
        model, inputs = build(row.gradient_accumulation)
        start = time.perf_counter()
        model.compile(*inputs)
        exe = model._executable
        settings = time_settings(model._options, True, exe.analysis.mode, len(exe.analysis.ipus))
        scale = sequences_per_pack() if row.model == "bert" else 1.0
        cache[key] = Compiled(
            row, exe.analysis, settings, exe.trainer, scale, time.perf_counter() - start
        )
    return dataclasses.replace(cache[key], row=row)


def predict(c: Compiled, cal: Calibration) -> float:
    """Predicted samples per second of ``c`` with parameters ``cal``."""
    return c.scale * estimate(c.analysis, c.settings, c.trainer, cal).samples_per_second


def errors(rows: list[Compiled], cal: Calibration) -> list[float]:
    """Relative error of each row (predicted / published - 1)."""
    return [predict(c, cal) / c.row.published - 1 for c in rows]


def fit(rows: list[Compiled]) -> Calibration:
    """``amp_efficiency`` and ``conv_efficiency`` with the smallest maximum error over ``rows``
    (a coarse grid, then a fine one around its best); the set parameters are kept."""
    best, best_err = CALIBRATION, float("inf")
    grid = [0.05 * i for i in range(1, 20)]
    grids = [(grid, grid)]
    for level in range(2):
        for amp, conv in itertools.product(*grids[level]):
            cal = dataclasses.replace(CALIBRATION, amp_efficiency=round(amp, 3),
                                      conv_efficiency=round(conv, 3))  # fmt: skip
            err = max(abs(e) for e in errors(rows, cal))
            if err < best_err:
                best, best_err = cal, err
        grids.append(tuple(
            [round(v + 0.005 * i, 3) for i in range(-10, 11) if 0 < v + 0.005 * i <= 1]
            for v in (best.amp_efficiency, best.conv_efficiency)
        ))  # fmt: skip
    return best


class _NoCounter:
    """Stands in for ``OpCounter`` to time the analysis without op counting."""

    def __init__(self) -> None:
        from poptorch_sim.analysis import OpTotals

        self.totals = OpTotals()

    def __enter__(self) -> _NoCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _analysis_seconds(exe: Any, count: bool, repeats: int = 3) -> float:
    from poptorch_sim.analysis.program import analyse_program
    from poptorch_sim.memory import activations

    first = exe.layout.micro_batch(exe.inputs, 0, 0, 0)
    real = activations.OpCounter
    activations.OpCounter = real if count else _NoCounter  # type: ignore[misc]
    try:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            analyse_program(exe.program, first, exe.trainer is not None)
            times.append(time.perf_counter() - start)
        return min(times)
    finally:
        activations.OpCounter = real  # type: ignore[misc]


def cost() -> None:
    """Print what the time estimate adds to the compile of each model of models.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models

    print(f"{'model':<22}{'compile':>10}{'counting':>10}{'estimate':>10}{'share':>8}")
    for key, case in models.CASES.items():
        size = dataclasses.replace(models.FULL, ga=max(models.FULL.ga, 2 * case.stages - 1))
        torch.manual_seed(0)
        model = case.build(size)
        batch = case.batch(size.micro * size.ga, size)
        _, sim = models.sim_call(case, model, batch, size, "pipelined", True)
        start = time.perf_counter()
        sim.compile(**batch)
        compile_s = time.perf_counter() - start
        exe = sim._executable
        counting = max(0.0, _analysis_seconds(exe, True) - _analysis_seconds(exe, False))
        estimate_s = poptorch.time_report(sim).seconds
        share = (counting + estimate_s) / compile_s
        print(f"{key:<22}{compile_s:>9.2f}s{1e3 * counting:>8.1f}ms{1e3 * estimate_s:>8.1f}ms"
              f"{100 * share:>7.1f}%")  # fmt: skip
        sim.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the parameters on these rows")
    parser.add_argument("--only", choices=("bert", "resnet"), help="one model's rows")
    parser.add_argument("--cost", action="store_true", help="the estimate's share of compiles")
    args = parser.parse_args(argv)
    if args.cost:
        cost()
        return 0
    cache: dict[tuple[str, int], Compiled] = {}
    rows = [compile_row(r, cache) for r in ROWS if args.only in (None, r.model)]
    start = time.perf_counter()
    cal = fit(rows) if args.fit else CALIBRATION
    if args.fit:
        print(f"fitted in {time.perf_counter() - start:.0f} s: {cal}")
    print(f"BERT sequences per pack (SPFHP, at most 3, Wikipedia histogram): "
          f"{sequences_per_pack():.3f}")  # fmt: skip
    print(f"{'row':<24}{'published':>12}{'predicted':>12}{'error':>9}{'compile':>10}")
    errs = errors(rows, cal)
    for c, err in zip(rows, errs):
        print(f"{c.row.name:<24}{c.row.published:>12,.0f}{predict(c, cal):>12,.0f}"
              f"{100 * err:>8.1f}%{c.compile_s:>9.1f}s")  # fmt: skip
    absolute = [abs(e) for e in errs]
    print(f"mean |error| {100 * statistics.mean(absolute):.1f}%, "
          f"max |error| {100 * max(absolute):.1f}%")  # fmt: skip
    return 0 if max(absolute) <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
