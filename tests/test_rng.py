"""A compiled model's own random stream (PopTorch's device RNG): ``randomSeed``, ``rng_state``,
save/load, and every execution path drawing from it, never from the host's stream.

Eager PyTorch has no per-model stream, so these pin PopTorch's documented behaviour: host draws
between calls change nothing on the device, models do not share a stream, a saved model carries
on as the original (``weights_writing_test::test_save_everything``) and one seed repeats its
numbers (``random_sampling_test::test_random_seed_repeatability``).
"""

from __future__ import annotations

import copy
import os
import pickle
import threading
from typing import Any

import pytest
import torch
from torch import nn

import poptorch_sim as poptorch

PATHS = ["eager", "pipelined", "sharded", "recomputed"]


class Dropped(nn.Module):
    """Dropout in two blocks (or none: the eager path); the loss is the mean square."""

    def __init__(self, blocks: bool) -> None:
        super().__init__()
        self.blocks = blocks
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)
        self.d1, self.d2 = nn.Dropout(0.5), nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.blocks:
            out = self.d2(self.b(self.d1(torch.relu(self.a(x)))))
            return out, poptorch.identity_loss(out.pow(2).mean(), "none")
        with poptorch.Block("A", ipu_id=0):
            h = self.d1(torch.relu(self.a(x)))
        with poptorch.Block("B", ipu_id=1):
            out = self.d2(self.b(h))
            loss = poptorch.identity_loss(out.pow(2).mean(), "none")
        return out, loss


def _options(path: str, seed: int | None = 5) -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(2)
    if seed is not None:
        opts.randomSeed(seed)
    opts.Training.gradientAccumulation(4)
    opts.outputMode(poptorch.OutputMode.All)
    if path in ("pipelined", "recomputed"):
        opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    elif path == "sharded":
        opts.setExecutionStrategy(poptorch.ShardedExecution())
    if path == "recomputed":
        opts._Popart.set("autoRecomputation", 3)
    return opts


def _training(path: str, seed: int | None = 5, state: dict | None = None) -> Any:
    net = Dropped(path != "eager")
    if state is not None:
        net.load_state_dict(state)
    return poptorch.trainingModel(
        net, _options(path, seed), poptorch.optim.SGD(net.parameters(), lr=0.1)
    )


X = torch.linspace(-1, 1, 8 * 8).reshape(8, 8)


def _program(model: Any) -> str:
    return type(model._executable.program).__name__


@pytest.mark.parametrize("path", PATHS)
def test_host_draws_between_calls_leave_the_next_masks_alone(path: str) -> None:
    state = Dropped(False).state_dict()
    quiet, busy = _training(path, state=state), _training(path, state=state)
    expected = [quiet(X)[0] for _ in range(3)]
    got = []
    for _ in range(3):
        got.append(busy(X)[0])
        torch.randn(1000)  # data augmentation on the host
    assert _program(busy) == ("EagerProgram" if path == "eager" else "StagedRunner")
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert not torch.equal(expected[0], expected[1])  # the stream moves on between calls


@pytest.mark.parametrize("path", PATHS)
def test_the_host_stream_is_left_as_it_was(path: str) -> None:
    model = _training(path, seed=None)
    for _ in range(2):  # the first call compiles
        host = torch.get_rng_state()
        model(X)
        assert torch.equal(torch.get_rng_state(), host)


@pytest.mark.parametrize("path", ["eager", "pipelined"])
def test_interleaved_models_draw_as_each_run_alone(path: str) -> None:
    state = Dropped(False).state_dict()
    alone = {}
    for seed in (1, 2):
        model = _training(path, seed, state)
        alone[seed] = [model(X)[0] for _ in range(2)]
    first, second = _training(path, 1, state), _training(path, 2, state)
    interleaved: dict[int, list[torch.Tensor]] = {1: [], 2: []}
    for _ in range(2):
        interleaved[1].append(first(X)[0])
        interleaved[2].append(second(X)[0])
    for seed in (1, 2):
        for e, g in zip(alone[seed], interleaved[seed]):
            torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_models_running_on_two_threads_at_once_draw_as_each_alone() -> None:
    # Their stage workers swap torch's generator under one lock (See [Note: a random stream
    # per model]): no draw of one lands in the other's stream.
    state = Dropped(False).state_dict()
    alone = {}
    for seed in (1, 2):
        model = _training("pipelined", seed, state)
        alone[seed] = [model(X)[0] for _ in range(4)]
    models = {seed: _training("pipelined", seed, state) for seed in (1, 2)}
    together: dict[int, list[torch.Tensor]] = {seed: [m(X)[0]] for seed, m in models.items()}

    def drive(seed: int) -> None:
        for _ in range(3):
            together[seed].append(models[seed](X)[0])

    threads = [threading.Thread(target=drive, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for seed in (1, 2):
        assert len(together[seed]) == 4
        for e, g in zip(alone[seed], together[seed]):
            torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_one_seed_gives_the_same_numbers_on_every_path() -> None:
    # Each micro-batch draws from its own stream, through the stages in order, so the masks
    # do not depend on how the stages are scheduled or whether they recompute.
    state = Dropped(False).state_dict()
    results = {}
    for path in PATHS:
        model = _training(path, 11, state)
        outs = [model(X) for _ in range(2)]
        results[path] = (outs, {k: v.clone() for k, v in model.model.state_dict().items()})
    outs, weights = results["eager"]
    assert (outs[0][0] == 0).any()  # dropout dropped
    for path in PATHS[1:]:
        for (out, loss), (ref_out, ref_loss) in zip(results[path][0], outs):
            torch.testing.assert_close(out, ref_out, msg=path)
            torch.testing.assert_close(loss, ref_loss, msg=path)
        for name, value in weights.items():
            torch.testing.assert_close(results[path][1][name], value, msg=f"{path} {name}")


@pytest.mark.parametrize("path", ["eager", "pipelined"])
def test_replicas_draw_different_masks(path: str) -> None:
    opts = _options(path).replicationFactor(2)
    net = Dropped(path != "eager")
    model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.0))
    out, _ = model(torch.ones(16, 8))
    # [DI, GA, R, mb] rows: the two replicas of one step see the same input
    per_replica = out.reshape(2, 4, 2, 1, 4)
    assert not torch.equal(per_replica[:, :, 0], per_replica[:, :, 1])


class Noise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x)


def test_rng_state_reads_and_writes_the_models_stream() -> None:
    model = poptorch.inferenceModel(Noise(), poptorch.Options().randomSeed(3))
    with pytest.raises(poptorch.Error, match="compile"):
        _ = model.rng_state
    x = torch.zeros(4, 3)
    model(x)
    state = model.rng_state
    assert state[0] == 3 and len(state) > 1
    first = model(x)
    assert model.rng_state != state
    model.rng_state = state
    torch.testing.assert_close(model(x), first, rtol=0, atol=0)
    model.rng_state = [3]  # a seed alone starts the stream again, as randomSeed does
    fresh = poptorch.inferenceModel(Noise(), poptorch.Options().randomSeed(3))
    torch.testing.assert_close(model(x), fresh(x), rtol=0, atol=0)


def test_rng_state_set_while_detached_is_written_at_attach() -> None:
    model = poptorch.inferenceModel(Noise(), poptorch.Options().randomSeed(3))
    x = torch.zeros(4, 3)
    model(x)
    state = model.rng_state
    expected = model(x)
    model.detachFromDevice()
    model.rng_state = state
    assert model.rng_state == state
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)  # attaches again


def test_a_random_seed_is_kept_across_detach_and_attach() -> None:
    # PopTorch seeds once per executable: attaching again continues the stream.
    x = torch.zeros(4, 3)
    model = poptorch.inferenceModel(Noise(), poptorch.Options().randomSeed(3))
    twin = poptorch.inferenceModel(Noise(), poptorch.Options().randomSeed(3))
    model(x), twin(x)
    model.detachFromDevice()
    torch.testing.assert_close(model(x), twin(x), rtol=0, atol=0)


@pytest.mark.parametrize("path", ["eager", "pipelined"])
def test_save_and_load_carry_on_the_stream(path: str, tmp_path: Any) -> None:
    # weights_writing_test::test_save_everything: a loaded model's outputs are those of the
    # original model carrying on.
    model = _training(path, 42)
    first, first_loss = model(X)
    file = os.path.join(tmp_path, "checkpoint.pt")
    model.save(file)
    carried = [model(X), model(X)]
    loaded = poptorch.load(file)
    again = [loaded(X), loaded(X)]
    for (out, loss), (load_out, load_loss) in zip(carried, again):
        torch.testing.assert_close(load_out, out, rtol=0, atol=0)
        torch.testing.assert_close(load_loss, loss, rtol=0, atol=0)
        assert not torch.allclose(out, first, rtol=1e-2, atol=1e-2)


def test_save_without_the_rng_state_starts_from_the_seed(tmp_path: Any) -> None:
    model = _training("eager", 42)
    model(X)
    file = os.path.join(tmp_path, "no_rng.pt")
    model.save(file, save_rng_state=False)
    loaded = poptorch.load(file)
    fresh = _training("eager", 42)
    fresh.compile(X)
    assert loaded.rng_state == fresh.rng_state != model.rng_state
    assert loaded.rng_state[0] == 42


def test_a_pickled_model_keeps_its_seed() -> None:
    model = poptorch.inferenceModel(Noise(), poptorch.Options().randomSeed(3))
    x = torch.zeros(4, 3)
    expected = model(x)
    copy = pickle.loads(pickle.dumps(model))
    torch.testing.assert_close(copy(x), expected, rtol=0, atol=0)  # compiles and seeds again


class Branches(nn.Module):
    """Blocks A and B both draw, and B takes nothing from A: their order is not fixed."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(16, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with poptorch.Block("A", ipu_id=0):
            h = self.drop(self.a(x))
        with poptorch.Block("B", ipu_id=1):
            g = self.drop(self.b(x))
        with poptorch.Block("C", ipu_id=2):
            return self.c(torch.cat([h, g], dim=1))


@pytest.mark.parametrize("model, keys", [(Branches, [0, 1, 0]), (lambda: Dropped(True), [0, 0])])
def test_stages_that_do_not_follow_each_other_draw_from_streams_of_their_own(
    model: Any, keys: list[int]
) -> None:
    opts = poptorch.Options().deviceIterations(4).randomSeed(2).autoRoundNumIPUs(True)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    inference = poptorch.inferenceModel(model().train(), opts)
    x = torch.ones(4, 8)
    first = inference(x)
    executors = inference._executable.program.runtime.stage_executors()
    assert [executors[s].stream_key for s in sorted(executors)] == keys
    again = poptorch.inferenceModel(copy.deepcopy(inference.model), opts)
    torch.testing.assert_close(again(x), first, rtol=0, atol=0)


def test_detach_reads_the_states_back_and_attach_writes_them(caplog: Any) -> None:
    # weights_writing_test::test_save_everything: detachFromDevice reads the RNG and optimizer
    # states back; the next call attaches and writes them; the numbers carry on.
    state = Dropped(False).state_dict()
    models = [_training("eager", 42, state) for _ in range(2)]
    for model in models:
        model(X)
    with caplog.at_level("DEBUG", logger="poptorch::python"):
        models[0].detachFromDevice()
        for line in ("Reading random seed", "Reading RNG state", "Detached from device"):
            assert line in caplog.text, line
        caplog.clear()
        out = models[0](X)
        for line in (
            "Setting random seed to",
            "Setting RNG state",
            "optimiser state tensors from host",
        ):
            assert line in caplog.text, line
    torch.testing.assert_close(out, models[1](X), rtol=0, atol=0)
