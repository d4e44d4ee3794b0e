"""poptorch.Options: setters, validation, freezing, copies, files and JSON."""

from __future__ import annotations

import pytest
import torch

import poptorch_sim as poptorch


def test_setters_chain_and_read_back() -> None:
    opts = poptorch.Options().deviceIterations(5).replicationFactor(2).randomSeed(7)
    opts.Training.gradientAccumulation(4).accumulationAndReplicationReductionType(
        poptorch.ReductionType.Sum
    )
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (5, 2, 7)
    assert opts.Training.toDict()["gradient_accumulation"] == 4
    d = opts.toDict()
    assert d["device_iterations"] == 5 and d["replication_factor"] == 2
    assert d["output_mode"] == int(poptorch.OutputMode.Default)


def test_frozen_once_given_to_a_model() -> None:
    opts = poptorch.Options()
    poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(2)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.Training.gradientAccumulation(2)
    clone = opts.clone()
    clone.deviceIterations(2)
    assert clone.device_iterations == 2 and opts.device_iterations == 1


def test_model_keeps_user_options_intact() -> None:
    opts = poptorch.Options()
    model = poptorch.trainingModel(torch.nn.Linear(2, 2), opts)
    assert opts.defaultOutputMode()
    assert model.options.output_mode == poptorch.OutputMode.Final


def test_tensor_locations_store_ints() -> None:
    opts = poptorch.Options()
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False)
    )
    assert opts.TensorLocations.location_optimizer["onChip"] == 0
    assert opts.optimizer_off_chip
    with pytest.raises(AssertionError, match="numIOTiles must be an even number"):
        opts.TensorLocations.numIOTiles(33)
    clone = opts.clone()
    assert clone.TensorLocations.location_optimizer == {"onChip": 0}


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda o: o.Training.accumulationAndReplicationReductionType(
                poptorch.ReductionType.NoReduction
            ),
            ValueError,
            "must be set to poptorch",
        ),
        (lambda o: o.outputMode(poptorch.OutputMode.EveryN), AssertionError, "return period"),
        (lambda o: o.setAvailableMemoryProportion({"0": 0.5}), AssertionError, "IPU0"),
        (
            lambda o: o.setAvailableMemoryProportion({"IPU0": 2.0}),
            ValueError,
            r"IPU0 must be a number in \(0, 1\], got 2.0",
        ),
        (lambda o: o.setAvailableMemoryProportion({"IPU0": 0.0}), ValueError, "got 0.0"),
        (lambda o: o.setAvailableMemoryProportion({"IPUx": 0.5}), ValueError, "'IPUx'"),
        (lambda o: o.Precision.setPartialsType(torch.int8), ValueError, "setPartialsType"),
        (lambda o: o.Jit.traceModel(True), ValueError, "no longer supported"),
        (lambda o: o.set(not_an_option=1), AssertionError, "Invalid option not_an_option"),
        (lambda o: o.set(device_iterations="2"), AssertionError, "Unexpected type"),
        (
            lambda o: o.inputReplicaGrouping(3, poptorch.CommGroupType.Consecutive),
            ValueError,
            "input_group_size",
        ),
    ],
    ids=[
        "NoReduction",
        "EveryN-no-period",
        "memory-key",
        "memory-above-1",
        "memory-zero",
        "memory-index",
        "partials",
        "jit",
        "unknown",
        "type",
        "grouping",
    ],
)
def test_validation(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call(poptorch.Options())


def test_popart_accepts_any_key() -> None:
    opts = poptorch.Options()
    opts._Popart.set("someFutureOption", 3).set("other", "x")
    assert opts._Popart.options["someFutureOption"] == 3
    assert opts.toDict()["other"] == "x"


def test_from_json_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = poptorch.Options().from_json(
        '{"deviceIterations": 3, "outputMode": "OutputMode.All", "_Popart.set": ["k", 1]}'
    )
    assert opts.device_iterations == 3 and opts.output_mode == poptorch.OutputMode.All
    assert opts._Popart.options["k"] == 1
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS", '{"replicationFactor": 4}')
    assert poptorch.Options().replication_factor == 4


def test_load_from_file(tmp_path) -> None:
    conf = tmp_path / "opts.conf"
    conf.write_text("# comment\ndeviceIterations(4)\n\nTraining.gradientAccumulation(2)\n")
    opts = poptorch.Options().loadFromFile(str(conf))
    assert opts.device_iterations == 4 and opts.Training.gradient_accumulation == 2
    bad = tmp_path / "bad.conf"
    bad.write_text("deviceIterations(4\n")
    with pytest.raises(poptorch.ConfigFileError, match="SyntaxError at line 1 of bad.conf"):
        poptorch.Options().loadFromFile(str(bad))


def test_load_from_yaml(tmp_path) -> None:
    conf = tmp_path / "opts.yaml"
    conf.write_text("deviceIterations: 6\nTraining.gradientAccumulation: 3\n")
    opts = poptorch.Options().loadFromFile(str(conf))
    assert opts.device_iterations == 6 and opts.Training.gradient_accumulation == 3


def test_repr_names_values_and_groups() -> None:
    text = repr(poptorch.Options().replicationFactor(4))
    assert text.startswith("Options(replication_factor=4")
    assert "Training=_TrainingOptions(gradient_accumulation=1" in text


def test_repr_shows_popart_options() -> None:
    ref = repr(poptorch.Options())
    fpe = poptorch.Options()
    fpe.Precision.enableFloatingPointExceptions(True)
    popart = poptorch.Options()
    popart._Popart.set("saveInitializersToFile", "my_file.onnx")
    assert repr(fpe) != ref and "'enableFloatingPointChecks': True" in repr(fpe)
    assert repr(popart).endswith("'saveInitializersToFile': 'my_file.onnx'}))")


def test_option_without_effect_is_stored_and_logged(capfd: pytest.CaptureFixture[str]) -> None:
    poptorch.setLogLevel("DEBUG")
    try:
        opts = poptorch.Options().enableExecutableCaching("cache_dir")
    finally:
        poptorch.setLogLevel("WARN")
    assert opts._Popart.options["enableEngineCaching"] is True
    assert "no effect in simulation" in capfd.readouterr().err


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("asdfasdf", True, "Unknown bool option asdfasdf"),
        ("asdfasdf", 3, "Unknown uint64 option asdfasdf"),
        ("dotChecks", torch.empty(1, 1), "Unknown value type Tensor for option dotChecks"),
    ],
    ids=["unknown-bool", "unknown-uint64", "tensor-value"],
)
def test_validate_options_refuses_what_poptorchs_compiler_would(key, value, match) -> None:
    opts = poptorch.Options()
    poptorch.poptorch_core._validateOptions(opts.toDict())  # the defaults are all known
    opts._Popart.set(key, value)
    with pytest.raises(poptorch.Error, match=match):
        poptorch.poptorch_core._validateOptions(opts.toDict())


def test_compiling_logs_each_option_set_as_poptorch_does(caplog) -> None:
    opts = poptorch.Options().deviceIterations(2).replicationFactor(1)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts.enableSyntheticData(True)
    opts.Precision.setPartialsType(torch.half)
    opts._Popart.set("engineOptions", {"debug.allowOutOfMemory": "true"})
    opts._Popart.set("notAnOption", 1)  # stored without effect, and not logged
    model = poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)
    with caplog.at_level("DEBUG", logger="poptorch::python"):
        model(torch.ones(2, 2))
    lines = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    for expected in [
        "poptorch.Options set device_iterations to value 2",
        "poptorch.Options set replication_factor to value 1",
        "poptorch.Options set execution_mode to value 1",
        "poptorch.Options set syntheticDataMode to value 2",
        "poptorch.Options set partialsTypeMatMuls to value half",
        "poptorch.Options set convolutionOptions[partialsType] to half",
        "poptorch.Options set engineOptions[debug.allowOutOfMemory] to true",
        "poptorch.Options set broadcast_buffers to value true",
    ]:
        assert expected in lines
    assert not any("notAnOption" in line for line in lines)
