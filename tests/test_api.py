"""The public API: ``poptorch_sim.__all__`` is exactly the PopTorch 3.4 names we support."""

from __future__ import annotations

import subprocess
import sys

import poptorch_sim

# PopTorch 3.4's intentional public names (reference §1.1), plus legacy AnchorMode.
POPTORCH_NAMES = {
    # errors and helpers
    "Error",
    "RecoverableError",
    "UnrecoverableError",
    "createPoptorchError",
    "isRunningOnIpu",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "setLogLevel",
    "load",
    "trainingModel",
    "inferenceModel",
    "PoplarExecutor",
    "registerPreCompileHook",
    "registerPostCompileHook",
    "ICustomArgParser",
    "registerCustomArgParser",
    "DataLoader",
    "AsynchronousDataAccessor",
    "print",
    "module_repr",
    "__version__",
    # enums
    "MeanReductionStrategy",
    "DataLoaderMode",
    "SharingStrategy",
    "OutputMode",
    "AnchorMode",
    "ConnectionType",
    "HalfFloatCastingBehavior",
    "ReductionType",
    "SyncPattern",
    "MatMulSerializationMode",
    "Liveness",
    "OverlapMode",
    "AutoStage",
    "MultiConvPlanType",
    "CommGroupType",
    "VariableRetrievalMode",
    # options
    "Options",
    "TensorLocationSettings",
    "Stage",
    "Phase",
    "PipelinedExecution",
    "ShardedExecution",
    "ParallelPhasedExecution",
    "SerialPhasedExecution",
    "Attribute",
    "ConfigFileError",
    "BlockId",
    # ops
    "ctc_beam_search_decoder",
    "ipu_print_tensor",
    "for_loop",
    "cond",
    "nop",
    "dynamic_slice",
    "dynamic_update",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
    "Block",
    "BeginBlock",
    "BlockFunction",
    "removeBlocks",
    "LegacyBeginBlockFn",
    "custom_op",
    "CPU",
    "identity_loss",
    "fps",
    "nearest",
    "MultiConv",
    "NameScope",
    # submodules
    "enums",
    "ops",
    "optim",
    "options",
    "poptorch_core",
    "profiling",
    "testing",
    # poptorch_sim additions
    "register_custom_op",
    "Sharder",  # PopRT's manual sharding
    "list_nodes",
    "memory_report",
    "time_report",
}


def test_all_is_exactly_the_supported_names() -> None:
    assert set(poptorch_sim.__all__) == POPTORCH_NAMES
    for name in poptorch_sim.__all__:
        assert hasattr(poptorch_sim, name), name


def test_poptorch_module_is_poptorch_sim_in_a_child_process() -> None:
    code = (
        "import poptorch, poptorch_sim, poptorch.options, poptorch.optim;"
        "assert poptorch is poptorch_sim;"
        "assert poptorch.options is poptorch_sim.options;"
        "print(poptorch.ipuHardwareVersion())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"


def test_hardware_is_configurable(monkeypatch) -> None:
    assert poptorch_sim.ipuHardwareIsAvailable(4)
    monkeypatch.setenv("POPTORCH_SIM_NUM_IPUS", "0")
    assert not poptorch_sim.ipuHardwareIsAvailable()
    monkeypatch.setenv("POPTORCH_SIM_NUM_IPUS", "2")
    assert poptorch_sim.ipuHardwareIsAvailable(2) and not poptorch_sim.ipuHardwareIsAvailable(4)


def test_run_script_with_module_runner(tmp_path) -> None:
    # The script imports a module beside it, as ``python user_script.py`` would let it, while
    # the runner starts from another folder.
    (tmp_path / "helpers.py").write_text("SCALE = 3.0\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = tmp_path / "user_script.py"
    script.write_text(
        "import sys, torch, poptorch\n"
        "from helpers import SCALE\n"
        "m = poptorch.inferenceModel(torch.nn.Identity())\n"
        "print('ok', sys.argv[1:], (SCALE * m(torch.ones(2))).tolist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "poptorch_sim", str(script), "--flag", "1"],
        capture_output=True,
        text=True,
        check=True,
        cwd=elsewhere,
    )
    assert out.stdout.strip() == "ok ['--flag', '1'] [3.0, 3.0]"


def test_private_utils_join_batches_on_dim_0() -> None:
    import torch
    from poptorch._utils import combine_batch_tensors_gen

    a = [torch.ones(2, 3), torch.zeros(1)]
    b = [torch.full((1, 3), 2.0), torch.ones(2)]
    joined = list(combine_batch_tensors_gen([a, b]))
    torch.testing.assert_close(joined[0], torch.cat([a[0], b[0]]))
    torch.testing.assert_close(joined[1], torch.cat([a[1], b[1]]))
    assert list(combine_batch_tensors_gen([])) == []
