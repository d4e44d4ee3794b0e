"""The predicted IPU time (``poptorch_sim.timing``), checked against arithmetic, not against itself."""

from __future__ import annotations

import logging

import pytest
import torch
from in_process import run_module
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.analysis import OpCounter
from poptorch_sim.timing import BOW, CALIBRATION, MK2, ipu_hardware
from poptorch_sim.timing.estimate import pipeline_cycles

WIDTH = 1024


class Chain(nn.Module):
    """``n`` equal stages of ``depth`` linear layers, each a block on its own IPU (or all on
    IPU 0)."""

    def __init__(self, n: int, width: int = WIDTH, blocks: bool = True, depth: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(n * depth))
        if blocks:
            for i in range(n):
                poptorch.BeginBlock(self.layers[i * depth], f"b{i}", ipu_id=i)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x if y is None else nn.functional.mse_loss(x, y)


def _options(ga: int = 1, version: int = 2, replicas: int = 1, **kw: object) -> poptorch.Options:
    opts = poptorch.Options().useOfflineIpuTarget(version).replicationFactor(replicas)
    opts.Training.gradientAccumulation(ga)
    if kw.get("sharded"):
        opts.setExecutionStrategy(poptorch.ShardedExecution())
    if kw.get("recompute") is not None:
        opts._Popart.set("autoRecomputation", int(kw["recompute"]))
    return opts


def _training(net: nn.Module, opts: poptorch.Options, mb: int, width: int = WIDTH) -> object:
    model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
    rows = mb * opts.Training.gradient_accumulation * opts.replication_factor
    # offline: only the first micro-batch is read, so the rest is never touched
    x, y = torch.empty(rows, width), torch.empty(rows, width)
    x[:mb], y[:mb] = torch.randn(mb, width), torch.randn(mb, width)
    model.compile(x, y)
    return model


def test_op_counter_counts_a_matmul_as_2mnk_flops() -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 32)
    with OpCounter() as counter:
        torch.relu(a @ b)
    assert counter.totals.flops == {"float32": 2 * 8 * 16 * 32}
    assert counter.totals.compute_ops == 1 and counter.totals.ops == 2
    assert counter.totals.memory_bytes == 2 * 8 * 32 * 4  # relu reads and writes 8x32 floats


def test_poptorch_markers_and_identities_cost_nothing_and_are_not_unknown() -> None:
    # vision/cnns pushes and pops a name scope around every module: no op to warn about.
    a = torch.randn(8, 16)
    with OpCounter() as counter:
        torch.ops.poptorch.push_name_scope("layer1")
        b = torch.ops.poptorch.recomputation_checkpoint(a)
        torch.ops.poptorch.pop_name_scope()
    torch.testing.assert_close(b, a)
    assert counter.totals.unknown == {}
    assert counter.totals.ops == 0 and counter.totals.memory_bytes == 0


@pytest.mark.parametrize(("stages", "ga"), [(2, 4), (4, 8), (3, 16)], ids=str)
def test_pipelined_training_takes_ga_plus_2_n_minus_1_cycles(stages: int, ga: int) -> None:
    model = _training(Chain(stages), _options(ga), mb=2)
    report = poptorch.time_report(model)
    assert report.pipeline_cycles == ga + 2 * (stages - 1)
    assert report.bubble_fraction == pytest.approx(2 * (stages - 1) / (ga + 2 * (stages - 1)))


def test_pipelined_inference_takes_micro_batches_plus_n_minus_1_cycles() -> None:
    opts = poptorch.Options().useOfflineIpuTarget(2).deviceIterations(6)
    model = poptorch.inferenceModel(Chain(3), opts)
    model.compile(torch.randn(6 * 2, WIDTH))
    assert poptorch.time_report(model).pipeline_cycles == 6 + 3 - 1
    assert pipeline_cycles("sharded", 3, 6, training=False) == 18


def test_each_ipu_s_time_adds_up_to_the_call() -> None:
    report = poptorch.time_report(_training(Chain(2), _options(4, replicas=2), mb=4))
    for ipu in report.ipus:
        assert ipu.busy + ipu.idle == pytest.approx(report.run_seconds)
    assert report.cycles == round(report.run_seconds * MK2.clock_hz)


def test_a_compute_bound_program_is_never_faster_than_peak_flops() -> None:
    mb, n = 512, 2
    net = Chain(n, blocks=False).half()
    model = poptorch.trainingModel(net, _options(4), torch.optim.SGD(net.parameters(), lr=0.1))
    x = torch.randn(4 * mb, WIDTH, dtype=torch.half)
    model.compile(x, x.clone())
    report = poptorch.time_report(model)
    flops = 3 * 4 * n * 2 * mb * WIDTH * WIDTH  # forward + 2x backward, GA 4, 2 layers
    assert report.run_seconds >= flops / MK2.peak_flops("float16")
    assert report.ipus[0].compute >= flops / MK2.peak_flops("float16")
    # and float32 runs at a quarter of the FP16 rate
    assert MK2.peak_flops("float32") == pytest.approx(MK2.peak_flops("float16") / 4)
    assert MK2.peak_flops() == pytest.approx(249.7e12, rel=1e-3)


def test_a_memory_bound_program_is_never_faster_than_the_memory_bandwidth() -> None:
    class Pointwise(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(10):
                x = torch.sigmoid(x)
            return x

    opts = poptorch.Options().useOfflineIpuTarget(2)
    model = poptorch.inferenceModel(Pointwise(), opts)
    x = torch.randn(4096, 4096)
    model.compile(x)
    bandwidth = MK2.tiles * MK2.memory_bytes_per_cycle * MK2.clock_hz
    assert bandwidth == pytest.approx(47.5e12)
    moved = 10 * 2 * x.numel() * 4  # each sigmoid reads and writes the tensor
    assert poptorch.time_report(model).ipus[0].compute >= moved / bandwidth


def test_pipelined_beats_sharded_by_n_ga_over_ga_plus_2_n_minus_1() -> None:
    # 16 layers a stage: the copies between IPUs are small beside a stage's compute
    n, ga, mb, w = 4, 16, 64, 512

    def chain() -> Chain:
        return Chain(n, width=w, depth=16)

    pipelined = poptorch.time_report(_training(chain(), _options(ga, recompute=0), mb, w))
    sharded = poptorch.time_report(_training(chain(), _options(ga, sharded=True), mb, w))
    expected = n * ga / (ga + 2 * (n - 1))
    assert sharded.run_seconds / pipelined.run_seconds == pytest.approx(expected, rel=0.05)
    # PopTorch recomputes a pipeline by default: one more forward in each backward
    recomputing = poptorch.time_report(_training(chain(), _options(ga), mb, w))
    assert recomputing.settings["recomputation"] and not pipelined.settings["recomputation"]
    compute = [r.ipus[0].compute for r in (pipelined, recomputing)]
    assert compute[1] / compute[0] == pytest.approx(4 / 3, rel=0.01)


def test_bow_is_faster_than_mk2_by_the_clock_ratio_when_compute_bound() -> None:
    def report(version: int) -> object:
        net = Chain(1, blocks=False, depth=4)
        return poptorch.time_report(_training(net, _options(8, version=version), mb=256))

    mk2, bow = report(2), report(21)
    assert (mk2.ipu_version, bow.ipu_version) == (2, 21)
    clock = BOW.clock_hz / MK2.clock_hz
    # what runs on the tiles scales with the clock; host IO over PCIe does not
    assert mk2.ipus[0].compute / bow.ipus[0].compute == pytest.approx(clock, rel=1e-9)
    ratio = bow.samples_per_second / mk2.samples_per_second
    assert ratio <= clock and ratio == pytest.approx(clock, rel=0.05)


def test_replicas_scale_samples_per_second_until_the_all_reduce_dominates() -> None:
    def throughput(replicas: int, mb: int, width: int, ga: int) -> tuple[float, object]:
        net = Chain(1, width=width, blocks=False, depth=2)
        report = poptorch.time_report(
            _training(net, _options(ga, replicas=replicas), mb=mb, width=width)
        )
        return report.samples_per_second, report

    # compute-heavy (64 micro-batches a step): nearly linear
    one, _ = throughput(1, 128, 1024, 64)
    eight, _ = throughput(8, 128, 1024, 64)
    assert 7.0 < eight / one <= 8.0
    # weight-heavy, little compute: the all-reduce dominates and scaling flattens
    counts = (1, 2, 4, 8, 16)
    small = [throughput(r, 1, 2048, 1) for r in counts]
    efficiency = [t / (r * small[0][0]) for r, (t, _) in zip(counts, small)]
    assert all(b < a for a, b in zip(efficiency, efficiency[1:])), efficiency
    assert efficiency[-1] < 0.5
    last = small[-1][1]
    assert last.ipus[0].all_reduce > last.ipus[0].compute
    assert "all_reduce" in last.bottleneck


def test_cycle_count_keeps_poptorchs_errors_and_returns_the_prediction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    net = Chain(2)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    off = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
    x = torch.randn(4, WIDTH)
    off(x, x)
    with pytest.raises(poptorch.Error, match="Cycle count logging is disabled. Please set option"):
        off.cycleCount()
    opts = poptorch.Options().logCycleCount(True)
    opts.Training.gradientAccumulation(4)
    net = Chain(2)
    on = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
    on.compile(x, x)
    with pytest.raises(poptorch.Error, match="Please run the model at least once"):
        on.cycleCount()
    with caplog.at_level(logging.DEBUG, logger="poptorch::python"):
        on(x, x)
    cycles = on.cycleCount()
    assert cycles == poptorch.time_report(on).cycles > 0
    assert f"Total number of IPU cycles: {cycles}" in caplog.text


def test_an_unknown_ipu_version_is_refused_with_the_known_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(poptorch.Error, match=r"unknown IPU version 3 \(known: 2 .*21"):
        _training(Chain(2), _options(4, version=3), mb=2)
    monkeypatch.setenv("POPTORCH_SIM_IPU_VERSION", "21")
    assert poptorch.ipuHardwareVersion() == 21
    assert ipu_hardware(21) is BOW
    monkeypatch.setenv("POPTORCH_SIM_IPU_VERSION", "7")
    with pytest.raises(poptorch.Error, match="unknown IPU version 7"):
        poptorch.ipuHardwareVersion()


def test_the_environment_sets_the_version_of_attached_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POPTORCH_SIM_IPU_VERSION", "21")
    net = Chain(2)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
    x = torch.randn(4, WIDTH)
    model.compile(x, x)
    assert poptorch.time_report(model).ipu_version == 21


@torch.library.custom_op("timing_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_an_unknown_op_is_named_once_in_a_warning_and_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Custom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _twice(_twice(x))

    with caplog.at_level(logging.WARNING, logger="poptorch::python"):
        for _ in range(2):
            model = poptorch.inferenceModel(Custom(), poptorch.Options().useOfflineIpuTarget(2))
            model.compile(torch.randn(8, 8))
    report = poptorch.time_report(model)
    assert report.unknown_ops == ["timing_test.twice"]
    assert caplog.text.count("does not know op timing_test.twice") == 1
    assert report.ipus[0].compute > 0  # counted as memory-bound, not as zero
    assert "timing_test.twice" in str(report)


def test_time_report_needs_a_compiled_model() -> None:
    model = poptorch.inferenceModel(Chain(1, blocks=False))
    with pytest.raises(poptorch.Error, match="time_report\\(\\) needs a compiled model"):
        poptorch.time_report(model)


def test_calibrated_efficiencies_never_exceed_the_hardware() -> None:
    assert 0 < CALIBRATION.amp_efficiency <= 1 and 0 < CALIBRATION.memory_efficiency <= 1
    assert CALIBRATION.superstep_cycles >= 0


class Uneven(nn.Module):
    """Four wide layers then four narrow ones: a stage of one wide layer is 4x a narrow one."""

    def __init__(self, user_blocks: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(256, 1024 if i < 4 else 256), nn.ReLU(),
                          nn.Linear(1024 if i < 4 else 256, 256))
            for i in range(8)
        )  # fmt: skip
        for ipu, i in enumerate(user_blocks):
            poptorch.BeginBlock(self.layers[i], f"u{ipu}", ipu_id=ipu)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return nn.functional.mse_loss(x, y)


def test_the_time_planner_balances_predicted_time_and_states_the_speedup() -> None:
    from poptorch_sim.timing.planner import plan_time

    net = Uneven((0, 5, 6, 7))  # the four wide layers on IPU 0
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(16)
    x = torch.randn(2048, 256)  # compute-bound: a wide layer costs about 4 narrow ones
    suggestion = plan_time(net, (x, x.clone()), opts, 4, optimizer="sgd")
    # the wide layers spread over the IPUs: a slowest stage of about 2 wide layers (8 narrow)
    # against the user's 4 wide and a narrow one (17 narrow)
    starts = [int(b.split(".")[1]) for b in suggestion.blocks]
    assert starts[0] == 0 and starts[2] <= 3
    assert suggestion.user_blocks == ["layers.0", "layers.5", "layers.6", "layers.7"]
    assert 1.5 < suggestion.speedup <= 17 / 8 + 0.05
    assert "predicted" in str(suggestion) and "as fast" in str(suggestion)
    suggestion.apply(net)
    model = poptorch.trainingModel(net, _options(16), torch.optim.SGD(net.parameters(), lr=0.1))
    model.compile(torch.randn(16 * 4, 256), torch.randn(16 * 4, 256))
    ipus = poptorch.time_report(model).ipus
    assert len(ipus) == 4


def test_the_memory_command_prints_the_time_report_too(
    tmp_path: object, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    script = Path(str(tmp_path)) / "train.py"
    script.write_text(
        "import torch, poptorch\n"
        "model = poptorch.inferenceModel(torch.nn.Linear(8, 8))\n"
        "model(torch.randn(2, 8))\n"
    )
    # ``python -m poptorch_sim.memory train.py``, run in this process (tests/in_process.py)
    status, out, err = run_module(
        "poptorch_sim.memory", str(script), capfd=capfd, monkeypatch=monkeypatch,
        env={"POPTORCH_SIM_IPU_VERSION": "21"},
    )  # fmt: skip
    assert status == 0, err[-2000:]
    assert "Memory per IPU" in out
    assert "Time per call (prediction for Bow IPUs at 1.850 GHz" in out


def test_the_gantt_chart_lays_out_ga_plus_2_n_minus_1_cycles(tmp_path: object) -> None:
    from pathlib import Path

    from poptorch_sim.timing.plot import timeline

    n, ga = 3, 6
    report = poptorch.time_report(_training(Chain(n), _options(ga, recompute=0), mb=4))
    bars = timeline(report)
    for ipu in range(n):  # every micro-batch forward and backward once per IPU
        kinds = [what for _, _, what in bars[ipu]]
        assert kinds.count("forward") == kinds.count("backward") == ga
    # the first IPU's last backward ends in the last cycle
    cycle = bars[1][0][0]  # IPU 1 starts one cycle late
    last = max(start + length for start, length, what in bars[0] if what == "backward")
    assert (ga + 2 * (n - 1) - 1) * cycle < last <= (ga + 2 * (n - 1)) * cycle * (1 + 1e-9)
    path = report.plot(str(Path(str(tmp_path)) / "gantt.png"))
    assert Path(path).stat().st_size > 0


def test_a_profiled_run_has_predicted_ipu_tracks_beside_the_host_tracks(tmp_path: object) -> None:
    import json
    from pathlib import Path

    folder = Path(str(tmp_path))
    opts = poptorch.Options().enableProfiling(str(folder))
    opts.Training.gradientAccumulation(4)
    net = Chain(2, width=64)
    model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
    x = torch.randn(8, 64)
    model(x, x.clone())
    model.destroy()
    trace = json.loads(next(folder.glob("execution_trace_*.json")).read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    predicted = next(pid for pid, name in processes.items() if name == "predicted IPU time")
    tracks = [e["args"]["name"] for e in trace
              if e["name"] == "thread_name" and e["pid"] == predicted]  # fmt: skip
    assert tracks == ["IPU 0 (predicted, Mk2 (GC200))", "IPU 1 (predicted, Mk2 (GC200))"]
    bars = [e for e in trace if e["pid"] == predicted and e["ph"] == "X"]
    assert sum(e["name"] == "forward" for e in bars) == 2 * 4  # 4 micro-batches on 2 IPUs
    assert any(e["pid"] != predicted and e["ph"] == "X" for e in trace)  # the host's own


def test_cycle_count_of_one_of_several_instances_warns_which_it_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from poptorch_sim.executor.inspection import cycle_count

    report = poptorch.time_report(_training(Chain(2), _options(4), mb=2))
    opts = poptorch.Options().logCycleCount(True)
    opts.Distributed.configureProcessId(0, 4)
    with caplog.at_level(logging.WARNING, logger="poptorch::python"):
        assert cycle_count(opts, True, report) == report.cycles
    assert "cycleCount() predicts one instance of 4 (Distributed.numProcesses)" in caplog.text


def test_a_stage_whose_ops_could_not_be_counted_is_named_not_a_silent_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import dataclasses

    from poptorch_sim.timing.estimate import estimate
    from poptorch_sim.timing.settings import time_settings

    model = _training(Chain(2), _options(4), mb=2)
    analysis = model._executable.analysis
    broken = dataclasses.replace(analysis.activations[1], ops=None, method="failed: Boom")
    analysis = dataclasses.replace(analysis, activations=[analysis.activations[0], broken])
    settings = time_settings(model._options, True, analysis.mode, 2)
    with caplog.at_level(logging.WARNING, logger="poptorch::python"):
        report = estimate(analysis, settings, model._executable.trainer)
    assert any("stage(s) [1] could not be counted (failed: Boom)" in n for n in report.notes)
    assert "could not be counted" in caplog.text


# -- the published rows (benchmarks/published): their structure, by arithmetic -------------------
def _published() -> object:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import published

    return published


def _log(*events: tuple[int, str, dict[str, object]]) -> list[str]:
    import json

    return [":::MLLOG " + json.dumps({"time_ms": t, "key": key, "metadata": meta, "value": None})
            for t, key, meta in events]  # fmt: skip


def test_mlperf_log_rates_are_each_blocks_samples_over_its_time(tmp_path: object) -> None:
    from pathlib import Path

    _published()
    from published.mlperf_logs import IMAGENET_TRAIN_IMAGES, block_rates, events, throughput

    epochs = _log((0, "epoch_start", {}), (10_000, "epoch_stop", {}),
                  (10_000, "epoch_start", {}), (30_000, "epoch_stop", {}))  # fmt: skip
    rates = block_rates(events(epochs), bert=False)
    assert rates == [IMAGENET_TRAIN_IMAGES / 10, IMAGENET_TRAIN_IMAGES / 20]
    folder = Path(str(tmp_path)) / "bert"
    folder.mkdir()
    for run, seconds in enumerate((100, 50, 40)):  # first blocks of 10, 20 and 25 per second
        blocks = _log((0, "block_start", {}), (seconds * 1000, "block_stop", {}),
                      (seconds * 1000 + 5, "eval_accuracy", {"epoch_num": 1000}),
                      (seconds * 1000 + 9, "block_start", {}),
                      (seconds * 1000 + 9 + 20_000, "block_stop", {}),
                      (seconds * 1000 + 9 + 20_001, "eval_accuracy", {"epoch_num": 1500}))  # fmt: skip
        (folder / f"result_{run}.txt").write_text("\n".join(["noise", *blocks]))
    # each run: the median of (its first block, 500 over 20 s = 25/s); then the runs' median
    figure, runs = throughput(folder)
    assert runs == [17.5, 22.5, 25.0] and figure == 22.5


def test_an_attention_ffn_placement_groups_the_sub_layers_in_order() -> None:
    published = _published()
    # MLPerf v1.1 IPU-POD16: IPUs 1-3 run 7+6, 6+7, 7+6 sub-layers, IPU 0 the last 4+5.
    groups = published.attention_ffn([(1, (7, 6)), (2, (6, 7)), (3, (7, 6)), (0, (4, 5))])
    assert groups == [(1, 13), (2, 13), (3, 13), (0, 9)]
    assert published.whole_layers((3, 7, 7, 7)) == [(0, 6), (1, 14), (2, 14), (3, 14)]
    with pytest.raises(ValueError, match="does not cut the sub-layers in order"):
        published.attention_ffn([(1, (3, 1)), (0, (21, 23))])  # attention 2 before its FFN 1
    for config in published.VALIDATION:  # each row says where it comes from
        assert "Graphcore/results/" in config.results and config.configuration, config.name


def test_a_bert_cut_between_attention_and_feed_forward_pipelines_each_group() -> None:
    pytest.importorskip("transformers")
    from poptorch_sim.offline import compile_offline

    published = _published()
    # embedding on IPU 0; IPU 1: attention 0, FFN 0; IPU 2: attention 1, FFN 1, attention 2;
    # IPU 0: FFN 2, attention 3, FFN 3 and the heads: 4 stages on 3 IPUs
    encoder = published.attention_ffn([(1, (1, 1)), (2, (2, 1)), (0, (1, 2))])

    def build() -> nn.Module:
        return published.bert_large_model(4, 64, encoder=encoder)

    ga = 8
    opts = published.bert_options(replicas=1, gradient_accumulation=ga, off_chip=False)
    model = compile_offline(build, opts, optimizer=published.lamb,
                            **published.bert_inputs(2 * ga, sequence=128))  # fmt: skip
    analysis = model._executable.analysis
    assert [ipu for _, ipu, _ in analysis.stages] == [0, 1, 2, 0]
    assert poptorch.time_report(model).pipeline_cycles == ga + 2 * (4 - 1)
    model.destroy()


def test_the_resnet_rows_send_8_bit_images_and_normalise_them_on_the_ipu() -> None:
    pytest.importorskip("torchvision")
    published = _published()
    # MLPerf ResNet-50 configs set eight_bit_io: the host sends uint8 pixels, 1 byte each
    config = published.resnet50("test", 1.0, 2, replicas=1, micro_batch=3)
    model = published.compile_published(config)
    analysis = model._executable.analysis
    assert analysis.host_input_bytes == 3 * (3 * 224 * 224 * 1 + 8)  # images + int64 labels
    model.destroy()
    net, seen = published.ResNetTraining().eval(), []
    net.net.conv1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    pixels = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        net(pixels, torch.tensor([0]))
    mean = torch.tensor(published.IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(published.IMAGENET_STD).view(3, 1, 1)
    assert torch.allclose(seen[0][0], (pixels[0] / 255.0 - mean) / std, atol=1e-6)
