"""Per-IPU memory: the estimate made at compile against what a real pipelined step holds, the
out-of-memory behaviour, the report's table, plot and profile files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from in_process import run_module
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim import env
from poptorch_sim.memory import measure, memory_report
from poptorch_sim.memory.activations import StageActivations
from poptorch_sim.memory.estimate import activation_peaks
from poptorch_sim.memory.saved import SavedBytes
from poptorch_sim.runtime.schedules import fill_drain, make_schedule

Batch = tuple[torch.Tensor, ...]


# -- models -----------------------------------------------------------------------------------
class Mlp(nn.Module):
    def __init__(self, ipus: int = 3, width: int = 48) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16 if i == 0 else width, width) for i in range(ipus))
        for i, layer in enumerate(self.layers):
            self.layers[i] = poptorch.BeginBlock(layer, f"L{i}", ipu_id=i)
        self.head = nn.Linear(width, 5)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        out = self.head(x)
        return out, self.loss(out, y)


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = poptorch.BeginBlock(
            nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
            "features",
            ipu_id=0,
        )
        self.pool = poptorch.BeginBlock(
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2)),
            "pool",
            ipu_id=1,
        )
        self.fc = nn.Linear(32, 4)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        out = self.fc(torch.flatten(self.pool(self.features(x)), 1))
        return out, self.loss(out, y)


def mlp_batch(n: int) -> Batch:
    return torch.randn(n, 16), torch.randint(0, 5, (n,))


def cnn_batch(n: int) -> Batch:
    return torch.randn(n, 3, 8, 8), torch.randint(0, 4, (n,))


def case_options(ga: int, replicas: int = 1, **kw: Any) -> poptorch.Options:
    opts = poptorch.Options().autoRoundNumIPUs(True)
    opts.Training.gradientAccumulation(ga)
    opts.replicationFactor(replicas)
    if kw.get("auto_increment"):
        opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    if kw.get("sharded"):
        opts.setExecutionStrategy(poptorch.ShardedExecution())
    if kw.get("recompute"):
        opts._Popart.set("autoRecomputation", 3)
    if kw.get("offload") or kw.get("rts"):
        where = poptorch.TensorLocationSettings()
        if kw.get("offload"):
            where.useOnChipStorage(False)
        if kw.get("rts"):
            where.useReplicatedTensorSharding(True)
        opts.TensorLocations.setOptimizerLocation(where)
    return opts


def _compare(model: poptorch.PoplarExecutor, *inputs: Any, **kwargs: Any) -> list[Any]:
    """Estimate against measurement, per IPU: weights and optimizer state exact, activations
    within 10%."""
    measured = measure(model, *inputs, **kwargs)
    report = memory_report(model)
    assert len(measured) == len(report.ipus) > 1
    for est, got in zip(report.ipus, measured):
        assert est.weights == got.weights, (est.ipu, est.weights, got.weights)
        assert est.optimizer_state == got.optimizer_state, est.ipu
        assert est.optimizer_state_off_chip == got.optimizer_state_off_chip, est.ipu
        assert got.activations > 0
        assert abs(est.activations - got.activations) <= 0.10 * got.activations, (
            est.ipu,
            est.activations,
            got.activations,
        )
    return measured


# -- estimate against measurement --------------------------------------------------------------
CASES = {
    "mlp-3ipu-ga8-adam": (Mlp, mlp_batch, 8, dict(), "adam"),
    "mlp-3ipu-ga8-adam-recompute": (Mlp, mlp_batch, 8, dict(recompute=True), "adam"),
    "mlp-3ipu-ga6-sgd-offload": (Mlp, mlp_batch, 6, dict(offload=True), "sgd"),
    "mlp-2ipu-ga4-r2-lamb-rts": (lambda: Mlp(2), mlp_batch, 4, dict(rts=True, replicas=2), "lamb"),
    "mlp-3ipu-ga5-adam-fp16-state": (Mlp, mlp_batch, 5, dict(), "adam-fp16"),
    "mlp-3ipu-ga4-sharded-rmsprop": (Mlp, mlp_batch, 4, dict(sharded=True), "rmsprop"),
    "cnn-2ipu-ga4-sgd": (Cnn, cnn_batch, 4, dict(), "sgd"),
    "cnn-2ipu-ga6-adamw-recompute-offload": (
        Cnn,
        cnn_batch,
        6,
        dict(recompute=True, offload=True),
        "adamw",
    ),
    "mlp-3ipu-ga6-sgd-momentum0": (Mlp, mlp_batch, 6, dict(), "sgd-momentum0"),
    "mlp-2ipu-ga8-sgd-checkpoints": (lambda: Marked("poptorch"), mlp_batch, 8, dict(), "sgd"),
}


def case_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd":
        return poptorch.optim.SGD(params, lr=0.01, momentum=0.9)
    if kind == "sgd-momentum0":
        return torch.optim.SGD(params, lr=0.01)
    if kind == "lamb":
        return poptorch.optim.LAMB(params, lr=1e-3)
    if kind == "adamw":
        return poptorch.optim.AdamW(params, lr=1e-3)
    if kind == "adam-fp16":
        return poptorch.optim.Adam(params, lr=1e-3, first_order_momentum_accum_type=torch.float16,
                                   second_order_momentum_accum_type=torch.float16)  # fmt: skip
    if kind == "rmsprop":
        return poptorch.optim.RMSprop(params, lr=1e-3, momentum=0.5, centered=True)
    return poptorch.optim.Adam(params, lr=1e-3)


@pytest.mark.parametrize("case", list(CASES))
def test_estimate_matches_a_measured_step(case: str) -> None:
    make, batch, ga, kw, kind = CASES[case]
    net = make()
    replicas = kw.pop("replicas", 1)
    opts = case_options(ga, replicas, **kw)
    model = poptorch.trainingModel(net, opts, case_optimizer(kind, net.parameters()))
    inputs = batch(4 * ga * replicas)
    _compare(model, *inputs)
    report = memory_report(model)
    if kw.get("offload"):
        assert all(m.optimizer_state == 0 < m.optimizer_state_off_chip for m in report.ipus)
    model.destroy()


def test_rts_divides_optimizer_state_by_the_replicas() -> None:
    totals = {}
    for rts in (False, True):
        net = Mlp(2)
        model = poptorch.trainingModel(
            net, case_options(4, 2, rts=rts), poptorch.optim.Adam(net.parameters())
        )
        model.compile(*mlp_batch(32))
        totals[rts] = [m.optimizer_state for m in memory_report(model).ipus]
        model.destroy()
    on_ipu = [
        list(net.layers[0].parameters()),
        [*net.layers[1].parameters(), *net.head.parameters()],
    ]
    for shards, rts in ((2, True), (1, False)):
        # Adam: two float32 moments per weight, each padded to a multiple of R and divided by
        # R under RTS, and a 4-byte step per weight.
        expected = [sum(2 * 4 * -(-p.numel() // shards) + 4 for p in ps) for ps in on_ipu]
        assert totals[rts] == expected


def test_report_is_per_replica_and_says_so() -> None:
    texts = {}
    for replicas, rts in ((1, False), (2, False), (2, True)):
        net = Mlp(2)
        model = poptorch.trainingModel(
            net, case_options(4, replicas, rts=rts), poptorch.optim.Adam(net.parameters())
        )
        model.compile(*mlp_batch(16 * replicas))
        report = memory_report(model)
        assert report.replicas == replicas and [m.ipu for m in report.ipus] == [0, 1]
        texts[replicas, rts] = str(report)
        model.destroy()
    assert "replica" not in texts[1, False].split("\n", 1)[1]
    assert "per replica: 2 replicas each hold this on their own IPUs" in texts[2, False]
    assert "(4 IPUs in all)" in texts[2, False] and "RTS:" not in texts[2, False]
    assert "(RTS: each holds 1/2 of the optimizer state)" in texts[2, True]


@pytest.mark.parametrize(("ga", "replicas"), [(1, 2), (4, 1), (4, 2)])
def test_gradient_accumulators_come_with_accumulation_only(ga: int, replicas: int) -> None:
    # PopART adds an accumulator per weight with gradient accumulation; replicas alone
    # all-reduce each gradient as it is produced.
    net = _WithLoss()
    opts = poptorch.Options().replicationFactor(replicas)
    opts.Training.gradientAccumulation(ga)
    model = poptorch.trainingModel(net, opts, poptorch.optim.Adam(net.parameters()))
    model.compile(*mlp_batch(4 * ga * replicas))
    ipu = memory_report(model).ipus[0]
    assert ipu.gradients == (ipu.weights if ga > 1 else 0)
    model.destroy()


def test_recomputation_keeps_only_stage_inputs_and_trains_like_eager() -> None:
    torch.manual_seed(1)
    net = Mlp(3)
    reference = Mlp(3)
    reference.load_state_dict(net.state_dict())
    x, y = mlp_batch(64)
    plain, recomputed = [], []
    for recompute, out in ((False, plain), (True, recomputed)):
        copy = Mlp(3)
        copy.load_state_dict(net.state_dict())
        model = poptorch.trainingModel(
            copy, case_options(8, recompute=recompute), torch.optim.SGD(copy.parameters(), lr=0.1)
        )
        model(x, y)
        out.append(memory_report(model))
        model.destroy()
        out.append(copy.state_dict())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for xb, yb in zip(x.chunk(8), y.chunk(8)):
        (reference(xb, yb)[1] / 8).backward()
    ref_opt.step()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(recomputed[1][name], value)
        torch.testing.assert_close(plain[1][name], value)
    first = (plain[0].ipus[0], recomputed[0].ipus[0])
    assert first[1].activations < first[0].activations  # 4 micro-batches in flight on IPU 0


class Marked(nn.Module):
    """Two IPUs; IPU 0 marks one value (by ``route``) between three layers and a dropout."""

    def __init__(self, route: str | None, p: float = 0.25) -> None:
        super().__init__()
        self.a1 = poptorch.BeginBlock(nn.Linear(16, 64), "a", ipu_id=0)
        self.a2 = nn.Linear(64, 64)
        self.a3 = nn.Linear(64, 64)
        self.drop = nn.Dropout(p)
        self.b = poptorch.BeginBlock(nn.Linear(64, 5), "b", ipu_id=1)
        self.route = route

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        h = torch.tanh(self.a1(x))
        if self.route == "poptorch":
            h = poptorch.recomputationCheckpoint(h)
        elif self.route == "torch.ops":
            h = torch.ops.poptorch.recomputation_checkpoint(h)
        h = self.drop(torch.tanh(self.a2(h)))
        out = self.b(torch.relu(self.a3(h)))
        return out, nn.functional.cross_entropy(out, y)


def _marked_run(
    route: str | None, recompute: int | None, state: dict, p: float = 0.25, capture: str = "fx"
) -> tuple[Any, ...]:
    net = Marked(route, p)
    net.load_state_dict(state)
    opts = poptorch.Options()
    opts.Jit.captureMethod(capture)
    opts.Training.gradientAccumulation(8)
    opts.randomSeed(3)
    if recompute is not None:
        opts._Popart.set("autoRecomputation", recompute)
    model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
    torch.manual_seed(11)
    x, y = mlp_batch(64)
    measured = _compare(model, x, y)
    out, _ = model(x, y)
    report = memory_report(model)
    model.destroy()
    return report, measured, net.state_dict(), out


@pytest.mark.parametrize("route", ["poptorch", "torch.ops"])
@pytest.mark.parametrize("recompute", [3, None], ids=["Pipeline", "not set"])
def test_recomputation_checkpoints_are_stashed_and_train_like_eager(
    route: str, recompute: int | None
) -> None:
    # PopTorch turns on RecomputationType.Pipeline for pipelined training over several IPUs;
    # the simulator does so when a stage marks values (see poptorch_sim/memory/settings.py).
    state = Marked(None).state_dict()
    report, measured, weights, _ = _marked_run(route, recompute, state)
    plain, _, plain_weights, _ = _marked_run(None, 0, state)
    inputs_only, *_ = _marked_run(None, 3, state)
    assert report.settings["recomputation"] and not plain.settings["recomputation"]
    # Per micro-batch, IPU 0 keeps its input (8 x 16 floats) and the marked value (8 x 64).
    assert inputs_only.ipus[0].activations_per_micro_batch == {0: 8 * 16 * 4}
    assert report.ipus[0].activations_per_micro_batch == {0: 8 * 16 * 4 + 8 * 64 * 4}
    assert measured[0].activations_per_micro_batch == {0: 8 * 16 * 4 + 8 * 64 * 4}
    assert inputs_only.ipus[0].activations < report.ipus[0].activations < plain.ipus[0].activations
    # Dropout draws the same masks when recomputed: the same weights as without recomputation.
    for name, value in plain_weights.items():
        torch.testing.assert_close(weights[name], value)
    assert all(not torch.equal(v, state[name]) for name, v in weights.items())


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_recomputation_checkpoints_match_eager(capture: str) -> None:
    # Both captures keep the mark as a node of the stage (torch.fx: the op, torch.export: its
    # overload).
    state = Marked(None, 0.0).state_dict()
    report, _, weights, out = _marked_run("poptorch", None, state, p=0.0, capture=capture)
    assert report.ipus[0].activations_per_micro_batch == {0: 8 * 16 * 4 + 8 * 64 * 4}
    eager = Marked("poptorch", 0.0)
    eager.load_state_dict(state)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    torch.manual_seed(11)
    x, y = mlp_batch(64)
    for xb, yb in zip(x.chunk(8), y.chunk(8)):
        (eager(xb, yb)[1] / 8).backward()
    opt.step()  # the measured call's step; the second call steps again
    expected_out = eager(x.chunk(8)[-1], y.chunk(8)[-1])[0]
    opt.zero_grad()
    for xb, yb in zip(x.chunk(8), y.chunk(8)):
        (eager(xb, yb)[1] / 8).backward()
    opt.step()
    torch.testing.assert_close(out, expected_out)
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(weights[name], value)


class Chain(nn.Module):
    """``layers`` x (Linear(64, 64), tanh), each output marked; then a head (on IPU 1 when
    ``blocks``). One micro-batch of 8 rows: each layer saves its input and its tanh output
    (2 x 8 x 64 floats = 4096 bytes), and keeps its marked output (2048 bytes)."""

    def __init__(self, layers: int = 4, blocks: bool = True) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(layers))
        self.head = nn.Linear(64, 5)
        if blocks:
            self.layers[0] = poptorch.BeginBlock(self.layers[0], "chain", ipu_id=0)
            self.head = poptorch.BeginBlock(self.head, "head", ipu_id=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        for layer in self.layers:
            x = poptorch.recomputationCheckpoint(torch.tanh(layer(x)))
        out = self.head(x)
        return out, nn.functional.cross_entropy(out, y)


_LAYER_SAVES, _MARK = 2 * 8 * 64 * 4, 8 * 64 * 4


@pytest.mark.parametrize("layers", [2, 4])
def test_recomputation_holds_one_segment_at_a_time(layers: int) -> None:
    # See [Note: recomputing one segment at a time]: on top of what the micro-batches in flight
    # keep, a backward holds one layer's recomputed activations, however many layers the stage
    # has (before, the whole stage's: layers x 4096 bytes).
    net = Chain(layers)
    opts = case_options(8, recompute=True)
    model = poptorch.trainingModel(net, opts, poptorch.optim.SGD(net.parameters(), lr=0.1))
    x, y = torch.randn(64, 64), torch.randint(0, 5, (64,))
    measured = _compare(model, x, y)
    ipu = memory_report(model).ipus[0]
    kept = _MARK + layers * _MARK  # the stage's input and each marked output
    assert ipu.activations_per_micro_batch == {0: kept}
    assert ipu.activations == kept * ipu.in_flight[0] + _LAYER_SAVES
    assert measured[0].activations == ipu.activations
    model.destroy()


def test_single_ipu_recompute_all_keeps_the_marks_and_one_segment() -> None:
    # RecomputeAll on one IPU (Graphcore's ResNet-50 runs so, with marks): one micro-batch in
    # flight keeps its inputs and marked values, and recomputes one segment at a time.
    opts = case_options(4)
    opts._Popart.set("autoRecomputation", 4)
    net = Chain(4, blocks=False)
    model = poptorch.trainingModel(net, opts, poptorch.optim.SGD(net.parameters(), lr=0.1))
    model.compile(torch.randn(32, 64), torch.randint(0, 5, (32,)))
    ipu = memory_report(model).ipus[0]
    kept = _MARK + 8 * 8 + 4 * _MARK  # x, the labels (int64) and the four marked outputs
    assert ipu.activations_per_micro_batch == {0: kept}
    assert ipu.activations == kept + _LAYER_SAVES
    model.destroy()


@pytest.mark.parametrize(
    ("momentum", "ga", "combined", "velocity"),
    [
        (0.0, 4, False, True),  # SGD2: a velocity even at momentum 0 with accumulation
        (0.9, 4, False, True),
        (0.0, 1, False, False),  # plain SGD (SGD0): no velocity, no accumulator
        (0.9, 4, True, False),  # SGD1: one combined tensor, no optimizer state
    ],
    ids=["sgd2-momentum0", "sgd2", "sgd0", "sgd1-combined"],
)
def test_sgd_variants_hold_what_poptorch_holds(
    momentum: float, ga: int, combined: bool, velocity: bool
) -> None:
    net = Mlp(2)
    opts = case_options(ga, sharded=ga == 1)
    sgd: torch.optim.Optimizer
    if momentum:
        sgd = poptorch.optim.SGD(net.parameters(), lr=0.01, momentum=momentum,
                                 use_combined_accum=combined)  # fmt: skip
    else:
        sgd = torch.optim.SGD(net.parameters(), lr=0.01)  # a constant momentum of 0
    model = poptorch.trainingModel(net, opts, sgd)
    _compare(model, *mlp_batch(4 * ga))
    report = memory_report(model)
    for est in report.ipus:
        assert (est.optimizer_state == est.weights) == velocity, est
        assert (est.optimizer_detail == {"velocity (float32)": est.weights}) == velocity
        assert est.gradients == (est.weights if ga > 1 or combined else 0)
    model.destroy()


# -- BERT and GPT-2 -----------------------------------------------------------------------------
transformers_cases = [
    "bert-4ipu-ga8",
    "bert-4ipu-ga16-recompute",
    "bert-4ipu-ga8-checkpoints",
    "gpt2-4ipu-ga10-offload",
]


def _mark_outputs(module: nn.Module, inputs: Any, outputs: Any) -> Any:
    """A forward hook marking a layer's outputs, as Graphcore's BERT and GPT-2 pipelines do."""
    if isinstance(outputs, tuple):
        return tuple(poptorch.recomputationCheckpoint(o) if isinstance(o, torch.Tensor) else o
                     for o in outputs)  # fmt: skip
    return poptorch.recomputationCheckpoint(outputs)


def transformer_case(case: str) -> tuple[nn.Module, dict[str, torch.Tensor], poptorch.Options]:
    pytest.importorskip("transformers")
    from test_real_models import bert_classifier, gpt2, text_batch

    ga = int(case.split("-ga")[1].split("-")[0])
    if case.startswith("bert"):
        model = bert_classifier()
        if "checkpoints" in case:
            for layer in model.bert.encoder.layer:
                layer.register_forward_hook(_mark_outputs)
        batch = {**text_batch(2 * ga), "labels": torch.randint(0, 3, (2 * ga,))}
        opts = case_options(ga, recompute="recompute" in case)
    else:
        model = gpt2()
        ids = torch.randint(0, 64, (2 * ga, 8))
        batch = {"input_ids": ids, "labels": ids}
        opts = case_options(ga, offload="offload" in case, auto_increment=True)
    return model, batch, opts


@pytest.mark.parametrize("case", transformers_cases)
def test_transformers_estimate_matches_a_measured_step(case: str) -> None:
    net, batch, opts = transformer_case(case)
    model = poptorch.trainingModel(net, opts, poptorch.optim.AdamW(net.parameters(), lr=1e-3))
    _compare(model, **batch)
    model.destroy()


# -- schedules and counting (no threads) --------------------------------------------------------
def test_activation_peaks_follow_each_ipus_actions() -> None:
    acts = [StageActivations(s, s, 100 * (s + 1), 10, "meta") for s in range(3)]
    peaks, flight = activation_peaks(fill_drain(3, 5), acts, recompute=False)
    assert flight == {0: 5, 1: 5, 2: 5} and peaks == {0: 500, 1: 1000, 2: 1500}
    schedule = make_schedule("1f1b", 3, 8, training=True)
    peaks, flight = activation_peaks(schedule, acts, recompute=False)
    assert flight == {0: 4, 1: 3, 2: 1}  # N - stage, one ahead but on the last stage
    assert peaks == {0: 400, 1: 600, 2: 300}
    peaks, _ = activation_peaks(schedule, acts, recompute=True)
    assert peaks == {0: 40 + 100, 1: 30 + 200, 2: 10 + 300}


def test_saved_bytes_count_aliases_once_and_views_by_their_extent() -> None:
    base = torch.zeros(10, 4)
    weight = torch.zeros(3)
    counter = SavedBytes([int(weight.untyped_storage()._cdata)])
    counter.add(base[2:4])
    counter.add(base[3:5])
    counter.add(base[2:4].t())
    counter.add(weight)
    assert counter.total() == 3 * 4 * 4


# -- the limit and PopTorch's out-of-memory behaviour -------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, 1472 * 624 * 1024),
        ("4096", 4096),
        ("2KB", 2048),
        ("1.5MB", 1572864),
        ("1GiB", 1 << 30),
    ],
)
def test_ipu_memory_env(monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: int) -> None:
    if raw is None:
        monkeypatch.delenv("POPTORCH_SIM_IPU_MEMORY", raising=False)
    else:
        monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", raw)
    assert env.ipu_memory() == expected


@pytest.mark.parametrize("raw", ["lots", "-5MB", "0", "12TB"])
def test_bad_ipu_memory_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", raw)
    with pytest.raises(ValueError, match="POPTORCH_SIM_IPU_MEMORY must be a positive size"):
        env.ipu_memory()


def test_bad_out_of_memory_mode_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPTORCH_SIM_OUT_OF_MEMORY", "explode")
    with pytest.raises(ValueError, match="'warn' or 'error', got 'explode'"):
        env.out_of_memory()


def _compile_small(opts: poptorch.Options | None = None) -> poptorch.PoplarExecutor:
    net = Mlp(3, width=128)
    model = poptorch.trainingModel(
        net, opts or case_options(6), poptorch.optim.Adam(net.parameters())
    )
    model.compile(*mlp_batch(24))
    return model


def test_over_the_limit_warns_by_default(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", "200KB")
    monkeypatch.delenv("POPTORCH_SIM_OUT_OF_MEMORY", raising=False)
    model = _compile_small()
    assert [m.ipu for m in memory_report(model).over_limit] == [1, 2]
    text = caplog.text
    assert "Out of memory on IPU 1" in text and "limit of 200.0 KiB" in text
    assert "optimizer state" in text
    model.destroy()


def test_over_the_limit_is_an_error_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", "200KB")
    monkeypatch.setenv("POPTORCH_SIM_OUT_OF_MEMORY", "error")
    with pytest.raises(poptorch.Error, match=r"^Out of memory on IPU 1: the estimate is"):
        _compile_small()


@pytest.mark.parametrize("how", ["engine options", "enableProfiling"])
def test_allow_out_of_memory_lets_it_compile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", "200KB")
    monkeypatch.setenv("POPTORCH_SIM_OUT_OF_MEMORY", "error")
    opts = case_options(6)
    if how == "engine options":
        monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps({"debug.allowOutOfMemory": "true"}))
    else:
        opts.enableProfiling(str(tmp_path))
        assert opts._Popart.options["engineOptions"]["debug.allowOutOfMemory"] == "true"
    model = _compile_small(opts)
    report = memory_report(model)
    assert not report.ipus[1].fits
    model(*mlp_batch(24))  # it runs, as PopTorch's profiling run of a model that does not fit
    model.destroy()
    if how == "enableProfiling":
        trace = json.loads(next(tmp_path.glob("execution_trace_*.json")).read_text())
        counters = [e for e in trace["traceEvents"] if e["ph"] == "C" and "memory" in e["name"]]
        assert [c["name"] for c in counters] == [
            f"IPU {i} memory estimate (MiB)" for i in range(3)
        ]
        assert counters[1]["args"]["weights"] == report.ipus[1].weights / 2**20
        names = sorted(os.listdir(tmp_path))
        assert any(n.startswith("memory_training_") and n.endswith(".png") for n in names)
        saved = json.loads(next(tmp_path.glob("memory_training_*.json")).read_text())
        assert [ipu["total"] for ipu in saved["ipus"]] == [m.total for m in report.ipus]


# -- the report ---------------------------------------------------------------------------------
def test_report_table_and_plot(tmp_path: Path) -> None:
    model = _compile_small()
    report = memory_report(model)
    text = str(report)
    assert "IPU" in text and "optimizer_state" in text and "allowance" in text
    assert len(text.splitlines()) >= 2 + len(report.ipus)
    ipu = report.ipus[0]
    assert ipu.total == ipu.weights + ipu.gradients + ipu.optimizer_state + ipu.activations + (
        ipu.allowance
    )
    assert ipu.gradients == ipu.weights  # float32 accumulators of float32 weights (GA 6)
    path = report.plot(str(tmp_path / "memory.png"))
    assert Path(path).read_bytes()[:4] == b"\x89PNG"
    model.destroy()


def test_memory_report_needs_a_compiled_model() -> None:
    net = Mlp(2)
    model = poptorch.trainingModel(
        net, case_options(4), poptorch.optim.SGD(net.parameters(), lr=0.1)
    )
    with pytest.raises(poptorch.Error, match="needs a compiled model"):
        memory_report(model)


def test_single_ipu_model_gets_a_report() -> None:
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
    model = poptorch.inferenceModel(net)
    model(torch.randn(4, 16))
    report = memory_report(model)
    assert [m.ipu for m in report.ipus] == [0]
    assert report.ipus[0].weights == sum(p.numel() * 4 for p in net.parameters())
    assert report.ipus[0].activations == 0 and report.ipus[0].gradients == 0


# -- the planner --------------------------------------------------------------------------------
def _tiny_bert(layers: int = 6) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    pytest.importorskip("transformers")
    import transformers
    from test_real_models import bert_config, text_batch

    model = transformers.BertForSequenceClassification(bert_config(num_hidden_layers=layers))
    return model, {**text_batch(16), "labels": torch.randint(0, 3, (16,))}


def test_plan_predicts_the_memory_of_the_placement_it_suggests() -> None:
    model, batch = _tiny_bert()
    opts = case_options(8)
    suggestion = poptorch.memory.plan(
        model, {k: v[:2] for k, v in batch.items()}, opts, 3, optimizer="adamw"
    )
    assert suggestion.fits and len(suggestion.blocks) == 3
    assert suggestion.blocks[0] == "bert.encoder.layer.0"
    assert "IPU 2: bert.encoder.layer." in str(suggestion)
    training = poptorch.trainingModel(
        suggestion.apply(model), opts, poptorch.optim.AdamW(model.parameters())
    )
    training.compile(**batch)
    compiled = memory_report(training)
    for predicted, got in zip(suggestion.report.ipus, compiled.ipus):
        assert predicted.weights == got.weights
        assert predicted.optimizer_state == got.optimizer_state
        assert predicted.activations == got.activations
    training.destroy()


def test_plan_moves_blocks_to_fit_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch = _tiny_bert()
    mb = {k: v[:2] for k, v in batch.items()}
    free = poptorch.memory.plan(model, mb, case_options(8), 2, optimizer="adam")
    totals = [m.total - m.allowance for m in free.report.ipus]
    # A limit just under the heavier IPU's need (the allowance is 10% of the limit).
    limit = int(max(totals) * 0.99 / 0.9)
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", str(limit))
    tight = poptorch.memory.plan(model, mb, case_options(8), 2, optimizer="adam")
    if tight.fits:
        assert tight.blocks != free.blocks
    assert all(m.limit == limit for m in tight.report.ipus)
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", "1KB")
    assert not poptorch.memory.plan(model, mb, case_options(8), 2).fits


def test_plan_works_on_a_meta_model_by_flops() -> None:
    pytest.importorskip("transformers")
    import transformers
    from test_real_models import bert_config

    with torch.device("meta"):
        model = transformers.BertForSequenceClassification(bert_config(num_hidden_layers=4))
    ids = torch.zeros(2, 8, dtype=torch.long, device="meta")
    suggestion = poptorch.memory.plan(model, {"input_ids": ids}, case_options(8), 2)
    assert suggestion.cost_unit == "FLOPs"
    assert suggestion.blocks == ["bert.encoder.layer.0", "bert.encoder.layer.2"]
    weights = sum(m.weights for m in suggestion.report.ipus)
    assert weights == sum(4 * t.numel() for t in model.parameters()) + 8 * 16 + 8 * 16


def test_plan_needs_enough_candidates() -> None:
    with pytest.raises(ValueError, match="at least as many candidate modules as IPUs"):
        poptorch.memory.plan(Mlp(2), mlp_batch(2), case_options(8), 4)


class _MarkedLayers(nn.Module):
    """Six equal layers (a Linear then a Tanh, each saving 4 x 32 floats: 512 bytes), each
    output marked with ``recomputationCheckpoint``; a loss that reads no label."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = poptorch.recomputationCheckpoint(layer(x))
        return poptorch.identity_loss(x.pow(2), reduction="mean")


def test_plan_holds_one_segment_between_marks_when_recomputing() -> None:
    # See [Note: recomputing one segment at a time]: a recomputing stage keeps its input and its
    # marked values per micro-batch in flight, and in backward holds again one segment (one
    # layer: 1,024 bytes), not the whole stage (three layers and the loss: 3,584 bytes).
    from poptorch_sim.offline import compile_offline

    with torch.device("meta"):
        net = _MarkedLayers()
    x = torch.empty(4, 32, device="meta")
    opts = case_options(8, recompute=True)
    suggestion = poptorch.memory.plan(net, (x,), opts, 2, optimizer="sgd")
    assert suggestion.blocks == ["layers.0", "layers.3"]  # equal FLOPs: three layers each
    first, second = suggestion.report.ipus
    value, segment = 512, 1024  # one activation; a Linear's input and the Tanh's output
    assert second.in_flight == {1: 1}
    assert second.activations_per_micro_batch == {1: value + 3 * value}  # input and 3 marks
    assert second.activations == 1 * (value + 3 * value) + segment
    # The planner leaves out the model's own inputs (the first stage's micro-batch).
    assert first.activations == first.in_flight[0] * 3 * value + segment
    batch = torch.empty(8 * 4, 32, device="meta")
    model = compile_offline(suggestion.apply(net), opts, batch, optimizer=(
        lambda params: poptorch.optim.SGD(params, lr=0.1)))  # fmt: skip
    compiled = memory_report(model).ipus
    assert compiled[1].activations == second.activations  # the estimate's own count
    assert compiled[0].activations == first.activations + compiled[0].in_flight[0] * value
    model.destroy()


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("stages, ga", [(2, 8), (3, 5), (4, 16)])
def test_the_planner_reads_each_ipus_peak_from_a_prefix_of_the_schedule(
    stages: int, ga: int, recompute: bool
) -> None:
    from poptorch_sim.memory.placement import _events

    full = make_schedule("1f1b", stages, ga, training=True)
    acts = [StageActivations(k, k, 1000 + 7 * k, 100 + k, "t", 30 * k, 300 + k)
            for k in range(stages)]  # fmt: skip
    peaks, flight = activation_peaks(full, acts, recompute)
    for k in range(stages):
        assert activation_peaks(_events(stages, ga, k), [acts[k]], recompute) == (
            {i: peaks[k] if i == k else 0 for i in range(stages)},
            {k: flight[k]},
        )


@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_fake_and_real_runs_count_the_same_bytes(fake: bool) -> None:
    from poptorch_sim.memory import activations

    net = Cnn()
    model = poptorch.trainingModel(
        net, case_options(4), poptorch.optim.SGD(net.parameters(), lr=0.1)
    )
    model.compile(*cnn_batch(16))
    stages = model._executable.program.program.stages
    inputs = dict(zip(model._executable.program.program.input_names, cnn_batch(4)))
    counts = activations._run_stages(stages, inputs, True, fake=fake)
    expected = [m.activations_per_micro_batch for m in memory_report(model).ipus]
    assert [{i: saved} for i, (saved, *_) in enumerate(counts)] == expected
    model.destroy()


class _WithLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        out = self.net(x)
        return out, nn.functional.cross_entropy(out, y)


def test_single_ipu_training_holds_one_micro_batch() -> None:
    net = _WithLoss()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    model = poptorch.trainingModel(net, opts, poptorch.optim.SGD(net.parameters(), lr=0.1))
    model(*mlp_batch(16))
    ipu = memory_report(model).ipus[0]
    # One micro-batch of 4 rows: the first Linear's input (4x16 floats), tanh's output (saved by
    # tanh and the second Linear: once), log-softmax's output (4x5), the labels (4 int64) and
    # the loss's total weight (one float).
    assert ipu.activations == 4 * (4 * 16 + 4 * 32 + 4 * 5) + 8 * 4 + 4
    assert ipu.gradients == ipu.weights  # float32 accumulators (gradient accumulation 4)
    model.destroy()


def test_planner_command_prints_the_report_of_the_first_compile(
    tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch, poptorch\n"
        "net = torch.nn.Sequential(torch.nn.Linear(8, int(sys.argv[1])), torch.nn.ReLU())\n"
        "model = poptorch.inferenceModel(net)\n"
        "model(torch.randn(2, 8))\n"
        "print('the program went on running')\n"
    )
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", "100KB")
    plot = tmp_path / "memory.png"
    for width, status in ((16, 0), (4096, 1)):
        # ``python -m poptorch_sim.memory ...``, run in this process (tests/in_process.py)
        code, out, err = run_module(
            "poptorch_sim.memory", "--plot", str(plot), str(script), str(width),
            capfd=capfd, monkeypatch=monkeypatch,
        )  # fmt: skip
        assert code == status, err[-2000:]
        assert "Memory per IPU" in out and "went on running" not in out
        assert ("OUT OF MEMORY" in out) == (status == 1)
    assert plot.exists()


def test_plan_leaves_the_model_and_the_rng_as_they_were() -> None:
    net = Cnn()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    batch = cnn_batch(4)
    rng = torch.get_rng_state()
    suggestion = poptorch.memory.plan(net, batch, case_options(4), 2, optimizer="sgd")
    assert suggestion.blocks[0] == "features"
    for name, value in net.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert torch.equal(torch.get_rng_state(), rng)
