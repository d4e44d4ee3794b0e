"""Executor lifecycle: compile, attach/detach, destroy, save/load, setOptimizer, anchors."""

from __future__ import annotations

import copy
import datetime
import io
import pickle

import pytest
import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        out = self.lin(x)
        return out, self.loss(out, y)


def _data(n: int = 4):
    return torch.randn(n, 4), torch.randint(0, 3, (n,))


def test_compile_then_call_and_compile_again_warns(capfd: pytest.CaptureFixture[str]) -> None:
    model = poptorch.inferenceModel(nn.Linear(4, 3))
    assert not model.isCompiled() and not model.isAttachedToDevice()
    x = torch.randn(2, 4)
    model.compile(x)
    assert model.isCompiled() and model.isAttachedToDevice()
    model.compile(x)
    assert "Call to compile() ignored" in capfd.readouterr().err
    assert isinstance(model.compilationTime(), datetime.timedelta)


def test_attach_detach_errors_and_implicit_reattach() -> None:
    model = poptorch.inferenceModel(nn.Linear(4, 3))
    with pytest.raises(poptorch.Error, match="Model has not been compiled or has been destroyed"):
        model.detachFromDevice()
    x = torch.randn(2, 4)
    model(x)
    with pytest.raises(poptorch.Error, match="Device is already attached"):
        model.attachToDevice()
    model.detachFromDevice()
    with pytest.raises(poptorch.Error, match="Device is not attached"):
        model.detachFromDevice()
    model(x)
    assert model.isAttachedToDevice()


def test_destroy_allows_new_inputs() -> None:
    model = poptorch.inferenceModel(nn.Linear(4, 3))
    model(torch.randn(2, 4))
    with pytest.raises(poptorch.Error, match="Shape mismatch for input"):
        model(torch.randn(5, 4))
    model.destroy()
    assert model(torch.randn(5, 4)).shape == (5, 3)


def test_offline_target_cannot_run() -> None:
    opts = poptorch.Options().useOfflineIpuTarget()
    model = poptorch.inferenceModel(nn.Linear(4, 3), opts)
    model.compile(torch.randn(2, 4))
    assert not model.isAttachedToDevice()
    with pytest.raises(AssertionError, match="offline device"):
        model(torch.randn(2, 4))


def test_optimizer_snapshot_until_set_optimizer() -> None:
    model = Net()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    training = poptorch.trainingModel(model, optimizer=opt)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = _data()
    training(x, y)
    train_reference(reference, ref_opt, (x, y), 1, 1, 1)
    opt.param_groups[0]["lr"] = 0.0  # not seen by the device yet
    training(x, y)
    train_reference(reference, ref_opt, (x, y), 1, 1, 1)
    torch.testing.assert_close(model.lin.weight, reference.lin.weight)
    training.setOptimizer(opt)
    before = model.lin.weight.detach().clone()
    training(x, y)
    torch.testing.assert_close(model.lin.weight, before)


def test_set_optimizer_rejects_changed_constant() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    training = poptorch.trainingModel(model, optimizer=opt)
    training(*_data())
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(poptorch.Error, match="momentum"):
        training.setOptimizer(opt)


def test_poptorch_optimizer_state_dict_reads_device_state() -> None:
    model = Net()
    opt = poptorch.optim.Adam(model.parameters(), lr=0.01)
    assert opt.state_dict()["ipu_state"] is None
    training = poptorch.trainingModel(model, optimizer=opt)
    training(*_data())
    state = opt.state_dict()["ipu_state"]
    device = training._executable.trainer.optimizer
    exp_avg = device.state[training._executable.device.model.lin.weight]["exp_avg"]
    torch.testing.assert_close(state["Accl1___lin.weight"], exp_avg)


def _eager_steps(model: nn.Module, opt: torch.optim.Optimizer, batches) -> None:
    for x, y in batches:
        opt.zero_grad()
        model(x, y)[1].backward()
        opt.step()


def test_specific_learning_rate_trains_only_its_weight_until_set_optimizer() -> None:
    model = Net()
    eager = copy.deepcopy(model)
    opt = poptorch.optim.Adam(model.parameters(), lr=0.01)
    training = poptorch.trainingModel(model, optimizer=opt)
    batches = [_data() for _ in range(3)]
    training(*batches[0])
    state = opt.state_dict()
    state["ipu_param"]["learningRate___specific___lin.weight"] = torch.tensor(0.5)
    opt.load_state_dict(state)
    training(*batches[1])
    read = opt.state_dict()["ipu_param"]
    torch.testing.assert_close(read["learningRate___specific___lin.weight"], torch.tensor(0.5))
    torch.testing.assert_close(read["learningRate___specific___lin.bias"], torch.tensor(0.01))
    # setOptimizer writes every value again: the group's learning rate for both.
    training.setOptimizer(opt)
    training(*batches[2])
    read = opt.state_dict()["ipu_param"]
    torch.testing.assert_close(read["learningRate___specific___lin.weight"], torch.tensor(0.01))
    # Eager: lin.weight in a group of its own for the second step.
    eager_opt = torch.optim.Adam(
        [{"params": [eager.lin.weight]}, {"params": [eager.lin.bias]}], lr=0.01
    )
    _eager_steps(eager, eager_opt, batches[:1])
    eager_opt.param_groups[0]["lr"] = 0.5
    _eager_steps(eager, eager_opt, batches[1:2])
    eager_opt.param_groups[0]["lr"] = 0.01
    _eager_steps(eager, eager_opt, batches[2:])
    torch.testing.assert_close(model.lin.weight, eager.lin.weight)
    torch.testing.assert_close(model.lin.bias, eager.lin.bias)


class TinyGradients(nn.Module):
    """float16 activations whose gradients underflow to 0 without loss scaling."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = nn.functional.linear(x.half(), self.lin.weight.half(), self.lin.bias.half())
        return out, poptorch.identity_loss(out.float().sum() * 1e-8, reduction="none")


def test_imported_loss_scaling_is_used_and_reported() -> None:
    model = TinyGradients()
    eager = copy.deepcopy(model)
    opt = poptorch.optim.SGD(model.parameters(), lr=1e7, loss_scaling=1.0)
    training = poptorch.trainingModel(model, optimizer=opt)
    x = torch.randn(4, 4)
    before = model.lin.weight.detach().clone()
    training(x)
    torch.testing.assert_close(model.lin.weight, before)  # float16 gradients underflowed
    state = opt.state_dict()
    opt.load_state_dict({**state, "ipu_param": {"lossScaling_FLOAT": torch.tensor(2.0**16)}})
    training(x)
    assert opt.state_dict()["ipu_param"]["lossScaling_FLOAT"].item() == 2.0**16
    # Eager: the same step with the loss scaled by 2^16 and the gradients unscaled.
    eager_opt = torch.optim.SGD(eager.parameters(), lr=1e7)
    (eager(x)[1] * 2.0**16).backward()
    for p in eager.parameters():
        p.grad /= 2.0**16
    eager_opt.step()
    assert (eager.lin.weight - before).abs().min() > 1e-3
    torch.testing.assert_close(model.lin.weight, eager.lin.weight)
    training.setOptimizer(opt)  # the optimizer's own loss scaling again
    training(x)
    assert opt.state_dict()["ipu_param"]["lossScaling_FLOAT"].item() == 1.0


@pytest.mark.parametrize(
    ("make", "ga", "has_velocity"),
    [
        (lambda p: poptorch.optim.SGD(p, lr=0.1), 1, False),
        (lambda p: poptorch.optim.SGD(p, lr=0.1, momentum=0.0), 1, True),
        (lambda p: poptorch.optim.SGD(p, lr=0.1), 2, True),
    ],
    ids=["constant-0", "variable-0", "constant-0-ga"],
)
def test_sgd_velocity_follows_popart_variant(make, ga, has_velocity) -> None:
    model = Net()
    eager = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(ga)
    opt = make(model.parameters())
    training = poptorch.trainingModel(model, opts, optimizer=opt)
    x, y = _data(4 * ga)
    training(x, y)
    state = opt.state_dict()["ipu_state"]
    names = {"Accl1___lin.weight", "Accl1___lin.bias"}
    assert set(state) == (names if has_velocity else set())
    train_reference(eager, torch.optim.SGD(eager.parameters(), lr=0.1), (x, y), 1, ga, 1)
    torch.testing.assert_close(model.lin.weight, eager.lin.weight)


def test_save_and_load_round_trip(tmp_path) -> None:
    model = Net()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = _data()
    training(x, y)
    path = str(tmp_path / "model.poptorch")
    training.save(path)
    loaded = poptorch.load(path)
    assert loaded.isCompiled()
    out_a, _ = poptorch.inferenceModel(model)(x, y)
    out_b, _ = poptorch.inferenceModel(loaded.model)(x, y)
    torch.testing.assert_close(out_a, out_b)


def test_anchored_gradients_and_updated_weights() -> None:
    model = Net()
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.anchorTensor("grad_w", "Gradient___lin.weight")
    opts.anchorTensor("new_w", "UpdatedVar___lin.weight")
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    assert "Gradient___lin.weight" not in []  # names exist only after compiling
    with pytest.raises(AssertionError, match="Model must be compiled"):
        training.getTensorNames()
    x, y = _data()
    training(x, y)
    assert "Gradient___lin.weight" in training.getTensorNames()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_opt.zero_grad()
    reference(x, y)[1].backward()
    torch.testing.assert_close(training.getAnchoredTensor("grad_w"), reference.lin.weight.grad)
    ref_opt.step()
    torch.testing.assert_close(training.getAnchoredTensor("new_w"), reference.lin.weight)
    with pytest.raises(AssertionError, match="No tensor with name nope found"):
        training.getAnchoredTensor("nope")


def test_hooks_run_around_compilation() -> None:
    calls: list[str] = []
    pre = poptorch.registerPreCompileHook(lambda: calls.append("pre"))
    post = poptorch.registerPostCompileHook(lambda: calls.append("post"))
    try:
        poptorch.inferenceModel(nn.Linear(2, 2))(torch.randn(1, 2))
    finally:
        pre.remove()
        post.remove()
    assert calls == ["pre", "post"]
    with pytest.raises(RuntimeError, match="Pre-compile hook must be callable"):
        poptorch.registerPreCompileHook(3)


def test_is_running_on_ipu_inside_model_only() -> None:
    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1 if poptorch.isRunningOnIpu() else x * 10

    x = torch.ones(1)
    assert poptorch.inferenceModel(Probe())(x).item() == 2.0
    assert Probe()(x).item() == 10.0
    assert not poptorch.isRunningOnIpu()


def test_outputs_are_demoted_and_keep_structure() -> None:
    class Many(nn.Module):
        def forward(self, x: torch.Tensor):
            return {"long": x.long(), "double": x.double(), "pair": (x, [x * 2])}

    out = poptorch.inferenceModel(Many())(torch.ones(2, 2))
    assert list(out) == ["long", "double", "pair"]
    assert out["long"].dtype == torch.int32 and out["double"].dtype == torch.float32
    torch.testing.assert_close(out["pair"][1][0], torch.full((2, 2), 2.0))


def test_in_place_input_changes_reach_the_caller() -> None:
    class AddOne(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x += 1
            return x * 1

    x = torch.zeros(2)
    model = poptorch.inferenceModel(AddOne())
    model(x)
    model(x)
    torch.testing.assert_close(x, torch.full((2,), 2.0))


def test_executor_forwards_attributes_to_model() -> None:
    module = Net()
    training = poptorch.trainingModel(module)
    assert training.lin is module.lin
    assert training.model is module
    assert training.options.Training.gradient_accumulation == 1


def test_keyword_only_after_variadic_positional() -> None:
    class Star(nn.Module):
        def forward(self, *xs: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
            total = sum(xs)
            return total if z is None else total + z

    model = poptorch.inferenceModel(Star())
    out = model(torch.ones(2), torch.ones(2), z=torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 3.0))


def test_custom_argument_type_is_split_into_micro_batches() -> None:
    class Pair:
        def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
            self.a, self.b = a, b

    class PairParser(poptorch.ICustomArgParser):
        def yieldTensors(self, struct: Pair):
            yield struct.a
            yield struct.b

        def reconstruct(self, original: Pair, tensors):
            return Pair(next(tensors), next(tensors))

    class UsesPair(nn.Module):
        def forward(self, p: Pair) -> torch.Tensor:
            return p.a * p.b

    poptorch.registerCustomArgParser(Pair, PairParser())
    try:
        model = poptorch.inferenceModel(UsesPair(), poptorch.Options().deviceIterations(3))
        a, b = torch.randn(6, 2), torch.randn(6, 2)
        torch.testing.assert_close(model(Pair(a, b)), a * b)
    finally:
        poptorch.registerCustomArgParser(Pair, None)


def test_unknown_updatable_buffer_is_an_error() -> None:
    opts = poptorch.Options().updatableNamedBuffers(["nope"])
    model = poptorch.inferenceModel(nn.BatchNorm1d(2), opts)
    with pytest.raises(poptorch.Error, match="Invalid updatable buffer nope"):
        model(torch.randn(4, 2))


def test_wrapped_model_can_destroy_its_executor() -> None:
    module = Net()
    training = poptorch.trainingModel(module)
    training(*_data())
    module.destroy()
    assert not training.isCompiled()
    poptorch.trainingModel(module)  # re-wrapping is allowed again


def test_repr_shows_begin_block_assignments() -> None:
    module = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    module[1] = poptorch.BeginBlock(module[1], "B2", ipu_id=1)
    assert "BeginBlock(user_id=B2, ipu_id=1)" in repr(poptorch.inferenceModel(module))


@pytest.mark.parametrize("wrap", [poptorch.inferenceModel, poptorch.trainingModel])
def test_wrapping_something_that_is_not_a_module_says_so(wrap) -> None:
    with pytest.raises(TypeError, match=f"poptorch.{wrap.__name__} expects a torch.nn.Module"):
        wrap(lambda x: x)


def test_a_pickled_inference_executor_loads_uncompiled_and_runs_like_eager() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    x = torch.randn(4, 4)
    before = inference(x)
    buffer = io.BytesIO()
    torch.save(inference, buffer)  # PopTorch programs save the wrapper itself
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded is not inference and not loaded.isCompiled()
    torch.testing.assert_close(loaded(x), model(x))
    torch.testing.assert_close(loaded(x), before)
    assert inference.isCompiled()  # saving left the original compiled


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc(x)
        return out, nn.functional.cross_entropy(out, y)


@pytest.mark.parametrize("compiled", [False, True], ids=["uncompiled", "trained"])
def test_a_pickled_training_executor_trains_on_like_eager(compiled: bool) -> None:
    # The copy keeps the model with the device's latest weights and the optimizer with its
    # latest state (the momentum), and compiles on its first call.
    net = _Classifier()
    reference = copy.deepcopy(net)
    training = poptorch.trainingModel(
        net, optimizer=poptorch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])

    def eager_step() -> None:
        ref_opt.zero_grad()
        reference(x, y)[1].backward()
        ref_opt.step()

    for _ in range(2 if compiled else 0):
        training(x, y)
        eager_step()
    buffer = io.BytesIO()
    torch.save(training, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    copied = pickle.loads(pickle.dumps(training))
    assert not loaded.isCompiled() and training.isCompiled() == compiled
    eager_step()
    for model in (loaded, copied, training):
        model(x, y)
        for name, value in reference.named_parameters():
            torch.testing.assert_close(model.model.get_parameter(name), value, msg=name)


def test_optimizer_state_crosses_the_host_boundary_with_poptorchs_log_lines(caplog) -> None:
    model = Net()
    opt = poptorch.optim.Adam(model.parameters(), lr=0.01)
    training = poptorch.trainingModel(model, optimizer=opt)
    x, y = _data()
    with caplog.at_level("INFO", logger="poptorch::python"):
        training(x, y)
        state = opt.state_dict()  # the device stepped: read back
        assert "Writing optimiser state tensors from IPU to host." in caplog.text
        training.detachFromDevice()
        edited = copy.deepcopy(state)
        edited["ipu_state"] = {k: torch.zeros_like(v) for k, v in state["ipu_state"].items()}
        opt.load_state_dict(edited)
        caplog.clear()
        training.attachToDevice()  # a state loaded while detached is written on attach
        assert "Writing optimiser state tensors from host to IPU memory." in caplog.text
    opt.host_state_is_dirty = True  # read the device again
    read = opt.state_dict()["ipu_state"]
    assert all(not v.any() for v in read.values())


def test_each_optimizer_group_written_to_the_device_is_logged_as_poptorch_does(caplog) -> None:
    model = Net()
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1)
    training = poptorch.trainingModel(model, optimizer=opt)
    with caplog.at_level("DEBUG", logger="poptorch::python"):
        training(*_data())
        assert "Updating group 0 optimizer with lr=0.1" in caplog.text
        for group in opt.param_groups:
            group["lr"] = 0.05
        training.setOptimizer(opt)
        assert "Updating group 0 optimizer with lr=0.05" in caplog.text
        assert "tensors affected ['lin.weight', 'lin.bias']" in caplog.text


class _ModeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        out = self.lin(x)
        return (out, nn.functional.cross_entropy(out, y)) if self.training else out


def test_inference_model_is_a_shallow_copy_that_eval_and_export_keep(tmp_path) -> None:
    user = _ModeNet()
    inference = poptorch.inferenceModel(user)
    assert inference.model is not user and inference.model.lin is user.lin
    inference.model.eval()  # PopTorch programs switch the inference copy only
    assert user.training
    x = torch.randn(2, 4)
    path = str(tmp_path / "valid.poptorch")
    inference.compileAndExport(path, x)
    loaded = poptorch.load(path)
    torch.testing.assert_close(loaded(x), user.eval()(x))


class _Draw(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 0).normal_()


def test_models_with_one_random_seed_draw_the_same_numbers(caplog) -> None:
    opts = poptorch.Options().randomSeed(42)
    with caplog.at_level("DEBUG", logger="poptorch::python"):
        first = poptorch.inferenceModel(_Draw(), opts)(torch.empty(2, 2))
        assert "Setting random seed to: 42" in caplog.text
    second = poptorch.inferenceModel(_Draw(), opts)(torch.empty(2, 2))
    torch.testing.assert_close(first, second)
    torch.manual_seed(42)
    host = torch.get_rng_state()
    third = poptorch.inferenceModel(_Draw(), opts)
    torch.testing.assert_close(third(torch.empty(2, 2)), first)
    assert torch.equal(torch.get_rng_state(), host)  # the device RNG is the model's own
    unseeded = poptorch.inferenceModel(_Draw())
    assert not torch.equal(unseeded(torch.empty(2, 2)), unseeded(torch.empty(2, 2)))
