"""PopTorch's error messages (reference §2.12), raised with PopTorch's exception types."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch


class TwoLosses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        out = self.lin(x)
        return nn.functional.mse_loss(out, y) + nn.functional.l1_loss(out, y)


class Wrapped(TwoLosses):
    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return poptorch.identity_loss(super().forward(x, y), "mean")


class NoLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return self.lin(x)


def test_bad_batch_dimension() -> None:
    opts = poptorch.Options().deviceIterations(3)
    model = poptorch.inferenceModel(nn.Linear(2, 2), opts)
    with pytest.raises(AssertionError, match=r"Invalid batch dimension: In the input \(4, 2\)"):
        model(torch.randn(4, 2))


def test_zero_sized_input() -> None:
    with pytest.raises(poptorch.Error, match="Zero-sized tensors are unsupported"):
        poptorch.inferenceModel(nn.Linear(2, 2))(torch.randn(0, 2))


def test_inference_with_gradient_accumulation() -> None:
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="gradientAccumulation to 1.*deviceIterations"):
        poptorch.inferenceModel(nn.Linear(2, 2), opts)
    sharded = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution())
    sharded.Training.gradientAccumulation(2)
    with pytest.raises(
        poptorch.Error, match=r"\(1\) when running a poptorch.inferenceModel\(\).$"
    ):
        poptorch.inferenceModel(nn.Linear(2, 2), sharded)


def test_no_loss_and_multiple_losses() -> None:
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    with pytest.raises(poptorch.Error, match="Couldn't find a loss in graph!"):
        poptorch.trainingModel(NoLoss())(x, y)
    with pytest.raises(poptorch.Error, match="Multiple independent losses found in graph"):
        poptorch.trainingModel(TwoLosses())(x, y)
    loss = poptorch.trainingModel(Wrapped())(x, y)
    assert loss.dim() == 0


def test_backward_on_outputs() -> None:
    out = poptorch.inferenceModel(nn.Linear(2, 2))(torch.randn(1, 2))
    with pytest.raises(poptorch.Error, match=r"backward\(\) cannot be called explicitly"):
        out.backward()


def test_runtime_input_mismatches() -> None:
    model = poptorch.inferenceModel(nn.Linear(2, 2))
    model(torch.randn(3, 2))
    with pytest.raises(
        poptorch.Error, match="Data type mismatch for input: expected torch.float32"
    ):
        model(torch.randn(3, 2).half())
    with pytest.raises(poptorch.Error, match="inputs passed at runtime don't match"):
        model(torch.randn(4, 2))

    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, k: int = 2) -> torch.Tensor:
            return x * k

    scaled = poptorch.inferenceModel(Scaled())
    scaled(torch.ones(1), 3)
    with pytest.raises(poptorch.Error, match="Value mismatch for k: expected 3 but got 5"):
        scaled(torch.ones(1), 5)


def test_mandatory_and_too_many_arguments() -> None:
    model = poptorch.inferenceModel(nn.Linear(2, 2))
    with pytest.raises(poptorch.Error, match="Mandatory parameter input missing"):
        model()
    with pytest.raises(AssertionError, match="Too many arguments provided"):
        model(torch.ones(1, 2), torch.ones(1, 2))


def test_invalid_options_type() -> None:
    with pytest.raises(poptorch.Error, match="Invalid type: 'options' is of type"):
        poptorch.inferenceModel(nn.Linear(2, 2), {"device_iterations": 2})


def test_buffer_reassigned_in_forward() -> None:
    class Reassign(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count = self.count + 1
            return x + self.count

    with pytest.raises(poptorch.Error, match="Buffer count is reassigned within the model"):
        poptorch.inferenceModel(Reassign())(torch.ones(1))


def test_unsupported_optimizer_type() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(AssertionError, match="Unsupported optimizer type"):
        poptorch.trainingModel(model, optimizer=torch.optim.Adagrad(model.parameters()))


def test_error_classes() -> None:
    assert issubclass(poptorch.RecoverableError, poptorch.Error)
    assert issubclass(poptorch.UnrecoverableError, poptorch.Error)
    err = poptorch.createPoptorchError("boom")
    assert str(err) == "'poptorch_py_error': boom" and err.message == "boom"
    assert poptorch.poptorch_core.Error is poptorch.Error


def test_set_log_level_errors() -> None:
    with pytest.raises(ValueError, match="Invalid log level integer"):
        poptorch.setLogLevel(5)
    with pytest.raises(ValueError, match="Unknown log level: LOUD"):
        poptorch.setLogLevel("LOUD")


@pytest.mark.parametrize(
    ("kind", "cls", "type_"),
    [
        ("Poptorch", poptorch.Error, "poptorch_cpp_error"),
        ("Popart", poptorch.Error, "popart_exception"),
        ("PopartInternal", poptorch.Error, "popart_internal_exception"),
        ("Poplibs", poptorch.Error, "poplibs_exception"),
        ("PoplarUnrecoverable", poptorch.UnrecoverableError, "poplar_unrecoverable_runtime_error"),
        ("PoplarUnknown", poptorch.Error, "poplar_unknown_runtime_error"),
        (
            "PoplarRecoverableFullReset",
            poptorch.RecoverableError,
            "poplar_recoverable_runtime_error",
        ),
        ("PoplarLinkError", poptorch.Error, "poplar_link_error"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_throw_test_error_kinds(kind: str, cls: type, type_: str) -> None:
    from poptorch_sim.poptorch_core import TestErrorType, _throwTestError

    with pytest.raises(poptorch.Error) as info:
        _throwTestError(TestErrorType[kind])
    err = info.value
    assert type(err) is cls and err.type == type_
    # The long form names the type and the nested contexts; message and location are split.
    assert f"'{type_}': {err.message}" in str(err)
    assert "throwTestError::topLevel" in str(err) and "throwTestError::bottomLevel" in str(err)
    assert err.location.count("throwTestError::bottomLevel") == 1
    assert "throwTestError" not in err.message


def test_throw_test_error_recovery_action_and_link_output() -> None:
    from poptorch_sim.poptorch_core import TestErrorType, _throwTestError

    with pytest.raises(poptorch.RecoverableError) as info:
        _throwTestError(TestErrorType.PoplarRecoverableFullReset)
    assert info.value.recovery_action == "FULL_RESET"
    assert "Recovery action required: FULL_RESET" in str(info.value)
    with pytest.raises(poptorch.Error) as link:
        _throwTestError(TestErrorType.PoplarLinkError)
    assert "-lfoo not found" in link.value.message


def test_is_compiling_with_dispatcher_only_inside_a_capture() -> None:
    from poptorch_sim.poptorch_core import isCompilingWithDispatcher

    from poptorch_sim.ipu_context import running_on_ipu

    assert not isCompilingWithDispatcher()
    with running_on_ipu():
        assert isCompilingWithDispatcher()
    model = poptorch.inferenceModel(nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        model(torch.ones(3, 3))  # fails inside forward
    assert not isCompilingWithDispatcher()


def test_private_logging_module_is_an_attribute_after_import_poptorch() -> None:
    # PopTorch's test helpers call poptorch._logging.setPopartLogLevel after a bare
    # `import poptorch`; a fresh interpreter shows whether the package imports it itself.
    code = "import poptorch; poptorch._logging.setPopartLogLevel('INFO'); print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_set_popart_log_level() -> None:
    from poptorch_sim import _logging
    from poptorch_sim.logger import popart_log_level

    with pytest.raises(ValueError, match="Level must be one of"):
        _logging.setPopartLogLevel(0)
    with pytest.raises(ValueError, match="Level must be one of .*got 'FOO'"):
        _logging.setPopartLogLevel("FOO")
    try:
        _logging.setPopartLogLevel("TRACE_ALL")
        assert popart_log_level() == "TRACE_ALL"
    finally:
        _logging.setPopartLogLevel("WARN")
    assert _logging.setLogLevel is poptorch.setLogLevel


def test_private_impl_names() -> None:
    from poptorch_sim import _impl

    assert _impl.isDispatchTracing() is False
    assert _impl.isRunningOnIpu is poptorch.isRunningOnIpu
    marker = object()
    assert _impl._restoreWrapperIfNecessary(marker) is marker


def test_more_ipus_than_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POPTORCH_SIM_NUM_IPUS", "2")
    opts = poptorch.Options().replicationFactor(4)
    model = poptorch.inferenceModel(nn.Linear(2, 2), opts)
    with pytest.raises(
        poptorch.Error, match=r"Failed to acquire 4 IPU\(s\).*POPTORCH_SIM_NUM_IPUS=4"
    ):
        model(torch.randn(4, 2))
    monkeypatch.setenv("POPTORCH_SIM_NUM_IPUS", "0")  # no hardware: the IPU Model has no limit
    assert poptorch.inferenceModel(nn.Linear(2, 2), opts)(torch.randn(4, 2)).shape == (4, 2)


class _Call(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


_REFUSED = {
    "one_hot-no-classes": (
        lambda x: torch.nn.functional.one_hot(x),
        torch.tensor([1, 3]),
        "OneHot num classes must be specified and must be constant.",
    ),
    "bincount-no-minlength": (
        torch.bincount,
        torch.tensor([1, 3]),
        "Bincount `minlength` must be specified and must be a constant.",
    ),
    "upsample-linear": (
        nn.Upsample(scale_factor=2, mode="linear"),
        torch.randn(1, 2, 3),
        r"Unsupported upsample mode aten::upsample_linear1d: currently only 'nearest'",
    ),
    "upsample-trilinear": (
        nn.Upsample(scale_factor=2, mode="trilinear"),
        torch.randn(1, 1, 2, 2, 2),
        r"aten::upsample_trilinear3d: currently only 'nearest' is supported",
    ),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_ops_poptorch_cannot_compile_are_refused_at_compile(case) -> None:
    fn, x, message = _REFUSED[case]
    model = poptorch.inferenceModel(_Call(fn))
    with pytest.raises(poptorch.Error, match=message):
        model.compile(x)


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: torch.nn.functional.one_hot(x, num_classes=5), torch.tensor([1, 3])),
        (lambda x: torch.bincount(x, minlength=5), torch.tensor([1, 3, 3])),
        (nn.Upsample(scale_factor=2, mode="nearest"), torch.randn(1, 2, 3)),
        (lambda x: x.masked_fill(x > 0, 0.0), torch.randn(6)),
        (lambda x: x[torch.tensor([2, 0])], torch.randn(6)),
    ],
    ids=["one_hot", "bincount", "nearest", "masked_fill", "int_index"],
)
def test_the_static_forms_of_those_ops_run_as_eager(fn, x) -> None:
    out, expected = poptorch.inferenceModel(_Call(fn))(x), fn(x)
    # int64 results come back as int32, as from an IPU.
    torch.testing.assert_close(out.to(expected.dtype), expected)


def test_boolean_mask_indexing_is_refused_as_a_dynamic_output_shape() -> None:
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    model = poptorch.inferenceModel(_Call(lambda x: x[x > 0]))
    with pytest.raises(DynamicOutputShapeException) as info:
        model.compile(torch.randn(6))
    assert "torch.where or masked_fill" in "".join(getattr(info.value, "__notes__", []))
