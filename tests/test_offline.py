"""Models on the meta device compiled offline: the same reports as real ones, and never run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.memory import memory_report
from poptorch_sim.offline import compile_offline


class Pipelined(nn.Module):
    """Three IPUs; the middle stage marks a value (recomputation keeps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = poptorch.BeginBlock(nn.Linear(16, 64), "a", ipu_id=0)
        self.b1 = poptorch.BeginBlock(nn.Linear(64, 64), "b", ipu_id=1)
        self.b2 = nn.Linear(64, 64)
        self.c = poptorch.BeginBlock(nn.Linear(64, 5), "c", ipu_id=2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        h = torch.relu(self.a(x))
        h = poptorch.recomputationCheckpoint(torch.tanh(self.b1(h)))
        out = self.c(torch.relu(self.b2(h)))
        return out, nn.functional.cross_entropy(out, y)


def _options(offline: bool, recompute: bool = False, replicas: int = 1) -> poptorch.Options:
    opts = poptorch.Options().autoRoundNumIPUs(True)
    if offline:
        opts.useOfflineIpuTarget()
    opts.Training.gradientAccumulation(6)
    opts.replicationFactor(replicas)
    if recompute:
        opts._Popart.set("autoRecomputation", 3)
        opts.TensorLocations.setOptimizerLocation(
            poptorch.TensorLocationSettings()
            .useOnChipStorage(False)
            .useReplicatedTensorSharding(True)
        )
    return opts


def _batch(device: str, replicas: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    n = 4 * 6 * replicas
    x = torch.empty(n, 16, device="meta") if device == "meta" else torch.randn(n, 16)
    return x, torch.zeros(n, dtype=torch.long, device=device)


def _same_reports(real: Any, meta: Any) -> None:
    assert meta.ipus == real.ipus
    assert (meta.schedule, meta.micro_batches, meta.settings) == (
        real.schedule,
        real.micro_batches,
        real.settings,
    )


@pytest.mark.parametrize(
    ("make", "recompute", "replicas"),
    [
        (Pipelined, False, 1),
        (Pipelined, True, 2),
        (lambda: nn.Sequential(nn.Linear(16, 5)), False, 1),
    ],
    ids=["pipelined", "pipelined-recompute-rts", "one-ipu"],
)
def test_meta_model_compiles_offline_to_the_real_models_report(
    make: Callable[[], nn.Module], recompute: bool, replicas: int
) -> None:
    if make is not Pipelined:
        make = _with_loss(make)
    torch.manual_seed(0)
    real_net = make()
    real = poptorch.trainingModel(
        real_net, _options(False, recompute, replicas), poptorch.optim.LAMB(real_net.parameters())
    )
    real.compile(*_batch("cpu", replicas))
    with torch.device("meta"):
        meta_net = make()
    meta = poptorch.trainingModel(
        meta_net, _options(True, recompute, replicas), poptorch.optim.LAMB(meta_net.parameters())
    )
    meta.compile(*_batch("meta", replicas))
    _same_reports(memory_report(real), memory_report(meta))
    assert all(p.is_meta for p in meta_net.parameters())  # nothing was allocated
    real.destroy()
    meta.destroy()


def _with_loss(make: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            out = self.net(x)
            return out, nn.functional.cross_entropy(out, y)

    return WithLoss


def test_a_compiled_meta_model_does_not_run() -> None:
    # PopTorch's offline targets compile and refuse to run; so does a meta model.
    model = compile_offline(Pipelined, _options(True), *_batch("meta"))
    with pytest.raises(AssertionError, match=r"offline device \(ConnectionType.Never\)"):
        model(*_batch("meta"))
    with pytest.raises(AssertionError, match="offline device"):
        model.attachToDevice()
    model.destroy()


@pytest.mark.parametrize("compile_first", [False, True], ids=["call", "compile"])
def test_a_meta_model_not_compiled_offline_names_the_offline_compile(compile_first: bool) -> None:
    with torch.device("meta"):
        net = Pipelined()
    model = poptorch.trainingModel(net, _options(False))
    with pytest.raises(poptorch.Error, match=r"meta device.*useOfflineIpuTarget\(\)"):
        if compile_first:
            model.compile(*_batch("meta"))
        else:
            model(*_batch("meta"))
    assert not model.isCompiled()
    model.destroy()


def test_meta_inputs_need_a_meta_model() -> None:
    model = poptorch.trainingModel(Pipelined(), _options(True))
    with pytest.raises(poptorch.Error, match="need a model on the meta device"):
        model.compile(*_batch("meta"))
    model.destroy()


def test_real_inputs_are_taken_as_shapes() -> None:
    model = compile_offline(Pipelined, _options(True), *_batch("cpu"))
    assert [m.ipu for m in memory_report(model).ipus] == [0, 1, 2]
    model.destroy()


def test_compile_offline_makes_a_copy_of_online_options_offline() -> None:
    opts = _options(False)
    model = compile_offline(
        Pipelined, opts, *_batch("meta"), optimizer=lambda ps: poptorch.optim.Adam(ps, lr=1e-3)
    )
    assert model.options.connection_type == poptorch.ConnectionType.Never
    assert opts.connection_type == poptorch.ConnectionType.Always
    assert memory_report(model).settings["optimizer"] == "adam"
    model.destroy()


def test_bert_like_model_on_meta_pipelined() -> None:
    transformers = pytest.importorskip("transformers")
    from test_real_models import bert_config

    def build() -> nn.Module:
        # Eager attention: scaled_dot_product_attention picks its kernel by device (a CPU
        # kernel saves less than the math the meta device runs), so the two would differ.
        config = bert_config(num_hidden_layers=4, attn_implementation="eager")
        net = transformers.BertForSequenceClassification(config)
        layers = net.bert.encoder.layer
        for k in range(1, 4):
            layers[k] = poptorch.BeginBlock(layers[k], f"layer{k}", ipu_id=k)
        return net

    def options(offline: bool) -> poptorch.Options:
        opts = _options(offline)
        opts.Training.gradientAccumulation(8)  # at least the 2 x 4 - 1 stages of training
        return opts.setExecutionStrategy(
            poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement)
        )

    opts = options(True)
    ids = torch.zeros(16, 8, dtype=torch.long, device="meta")
    labels = torch.zeros(16, dtype=torch.long, device="meta")
    model = compile_offline(build, opts, input_ids=ids, labels=labels)
    meta = memory_report(model)
    model.destroy()
    torch.manual_seed(0)
    real_net = build()
    real = poptorch.trainingModel(real_net, options(False))
    real.compile(
        input_ids=ids.new_zeros(ids.shape, device="cpu"), labels=labels.new_zeros(16, device="cpu")
    )
    assert [m.ipu for m in meta.ipus] == [0, 1, 2, 3]
    _same_reports(memory_report(real), meta)
    real.destroy()


@pytest.mark.slow  # about 90 s: BERT-Large and ResNet-50 at full size, six times each
def test_the_published_configurations_fit() -> None:
    # They ran on hardware (MLPerf Training v1.0, v1.1, v2.0), so none may be out of memory.
    pytest.importorskip("transformers")
    pytest.importorskip("torchvision")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from published import CONFIGURATIONS, VALIDATION, compile_published

    for config in [*CONFIGURATIONS, *VALIDATION]:
        model = compile_published(config)
        report = memory_report(model)
        model.destroy()
        assert not report.over_limit, (config.name, str(report))
        assert report.settings["recomputation"], config.name
