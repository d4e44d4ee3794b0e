"""Where poptorch_sim knowingly differs from PopTorch on an IPU (each is documented)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from oracle import train_reference
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.executor.staged import StagedRunner


def test_python_side_effects_in_forward_repeat_per_micro_batch() -> None:
    # An IPU runs a graph traced once; the single-IPU simulator runs forward per micro-batch
    # (see poptorch_sim/executor/eager.py), so Python counters advance every micro-batch.
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return x

    module = Counting()
    opts = poptorch.Options().deviceIterations(4)
    model = poptorch.inferenceModel(module, opts)
    model(torch.ones(4, 1))
    # The device copy counted: once at compile time (PopTorch's trace), then once per
    # micro-batch (an IPU would replay the traced graph and count nothing more).
    assert model._executable.device.model.calls == 1 + 4
    assert module.calls == 0


def test_float64_inputs_are_converted_before_the_model_sees_them() -> None:
    seen: list[torch.dtype] = []

    class Probe(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.dtype)
            return x

    poptorch.inferenceModel(Probe())(torch.ones(2, dtype=torch.float64))
    assert set(seen) == {torch.float32}


def test_cycle_count_is_a_prediction_not_a_count() -> None:
    # PopTorch counts cycles on hardware only; here cycleCount() is the time model's prediction
    # of the last call (poptorch_sim.timing), the same for every call of a compiled model.
    model = poptorch.inferenceModel(nn.Linear(4, 4), poptorch.Options().logCycleCount(True))
    model(torch.ones(1, 4))
    first = model.cycleCount()
    model(torch.ones(1, 4))
    assert model.cycleCount() == first == poptorch.time_report(model).cycles > 0


class DataDependentBlocks(nn.Module):
    """Two IPUs, but a branch on a tensor's value that torch.fx cannot trace."""

    def __init__(self, begin_block: bool) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        second = nn.Linear(4, 3)
        self.second = poptorch.BeginBlock(second, ipu_id=1) if begin_block else second
        self.begin_block = begin_block

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with poptorch.Block("A", ipu_id=0):
            h = torch.relu(self.first(x))
            if h.sum() > 0:  # data-dependent: fx cannot trace this
                h = h * 2
        if self.begin_block:
            out = self.second(h)
        else:
            with poptorch.Block("B", ipu_id=1):
                out = self.second(h)
        return out, nn.functional.cross_entropy(out, y)


@pytest.mark.parametrize("begin_block", [False, True], ids=["with-Block", "BeginBlock"])
def test_untraceable_model_with_blocks_runs_as_one_program(capfd, begin_block: bool) -> None:
    # PopTorch would pipeline it over two IPUs. poptorch_sim needs a graph (torch.fx or
    # torch.export) to cut stages, so it warns (naming the line) and runs the model on one
    # simulated IPU: same numbers.
    model = DataDependentBlocks(begin_block)
    eager = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    for _ in range(2):
        out, _ = training(x, y)
    err = capfd.readouterr().err
    assert "cannot trace DataDependentBlocks.forward" in err and "if h.sum() > 0" in err
    assert "cannot capture DataDependentBlocks.forward with torch.export" in err
    assert "falls back to running this model as one program" in err
    assert not isinstance(training._executable.program, StagedRunner)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        outs = train_reference(eager, eager_opt, (x, y), 1, 3, 1)
    torch.testing.assert_close(out, outs[0][-1][0][0])  # OutputMode.Final: the last micro-batch
    for (name, ours), theirs in zip(model.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(ours, theirs, msg=name)


def test_cuda_runs_the_generic_kernels_which_the_tile_engine_does_not_count() -> None:
    # CUDA tensors run torch's kernels through poptorch_sim/kernels/generic/, not tile
    # kernels: the ops have CUDA kernels, and the engine counters see only the C++ ones.
    from poptorch_sim import kernels
    from poptorch_sim.kernels import generic

    for name in generic.KERNELS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"poptorch_sim::{name}", "CUDA")
    kernels.reset_counters()
    generic.sort(torch.randn(100))
    assert "sort" not in kernels.counters()
    kernels.sort(torch.randn(100))
    assert kernels.counters()["sort"].calls == 1


def test_training_with_overlapped_io_runs_without_io_threads() -> None:
    # PopTorch overlaps a training model's IO as well; poptorch_sim applies PopTorch's checks
    # (strategy, IO tiles, output mode) but runs training's host IO just in time: only
    # inference models get the load / compute / store threads (runtime/io_tiles.py).
    mode = poptorch.OverlapMode.OverlapAccumulationLoop

    class Marked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.lin(poptorch.set_overlap_for_input(x, mode))
            loss = poptorch.identity_loss((y**2).mean(), reduction="none")
            return poptorch.set_overlap_for_output(y, mode), loss

    module = Marked()
    reference = copy.deepcopy(module)
    opts = poptorch.Options().deviceIterations(2).outputMode(poptorch.OutputMode.All)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts.TensorLocations.numIOTiles(32)
    model = poptorch.trainingModel(module, opts, poptorch.optim.SGD(module.parameters(), lr=0.1))
    x = torch.randn(4, 3)
    model(x)
    assert model._executable.io is None
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for half in x.split(2):
        optimizer.zero_grad()
        reference(half)[1].backward()
        optimizer.step()
    model.copyWeightsToHost()
    torch.testing.assert_close(module.lin.weight, reference.lin.weight)


def test_one_overlapped_output_sends_every_input_and_output_through_the_io_threads(
    tmp_path: Path,
) -> None:
    # PopTorch overlaps only the marked tensors; poptorch_sim's IO threads load every input
    # and store every output of a model that marks any (see set_overlap_for_input).
    class OutputOnly(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            mode = poptorch.OverlapMode.OverlapAccumulationLoop
            return poptorch.set_overlap_for_output(a + b, mode), a * b

    opts = poptorch.Options().deviceIterations(2).enableProfiling(str(tmp_path))
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts.TensorLocations.numIOTiles(32)
    model = poptorch.inferenceModel(OutputOnly(), opts)
    model(torch.ones(4, 2), torch.ones(4, 2))
    io = model._executable.io
    loads = [e for e in io.trace.events if e.track == "load"]
    stores = [e for e in io.trace.events if e.track == "store"]
    assert len(loads) == len(stores) == 2  # both micro-batches, both inputs and outputs each
    model.destroy()


def test_a_model_over_its_memory_limit_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # On an IPU it would fail to compile; the simulator warns and runs it (set
    # POPTORCH_SIM_OUT_OF_MEMORY=error for the IPU's behaviour; see poptorch_sim/memory/limits.py).
    monkeypatch.setenv("POPTORCH_SIM_IPU_MEMORY", "1KB")
    monkeypatch.delenv("POPTORCH_SIM_OUT_OF_MEMORY", raising=False)
    net = nn.Linear(64, 64)
    model = poptorch.inferenceModel(net)
    x = torch.randn(2, 64)
    torch.testing.assert_close(model(x), net(x))
    assert poptorch.memory_report(model).over_limit


def test_pipelined_training_recomputes_only_when_asked_or_marked() -> None:
    # PopTorch turns on RecomputationType.Pipeline for pipelined training over several IPUs
    # when autoRecomputation is not set. The simulator does so only for stages that mark values
    # with recomputationCheckpoint; otherwise each stage keeps its activations until its
    # backward (no second forward), and the memory estimate counts what it keeps (see
    # poptorch_sim/memory/settings.py).
    def compiled(checkpoint: bool, recompute: int | None) -> list[int]:
        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a = poptorch.BeginBlock(nn.Linear(4, 8), "a", ipu_id=0)
                self.b = poptorch.BeginBlock(nn.Linear(8, 2), "b", ipu_id=1)

            def forward(self, x: torch.Tensor, y: torch.Tensor):
                h = torch.tanh(self.a(x))
                h = poptorch.recomputationCheckpoint(h) if checkpoint else h
                out = self.b(torch.tanh(h))
                return out, nn.functional.cross_entropy(out, y)

        net = Net()
        opts = poptorch.Options()
        opts.Training.gradientAccumulation(4)
        if recompute is not None:
            opts._Popart.set("autoRecomputation", recompute)
        model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
        model.compile(torch.randn(16, 4), torch.randint(0, 2, (16,)))
        report = poptorch.memory_report(model)
        model.destroy()
        return [report.settings["recomputation"], *(m.activations for m in report.ipus)]

    assert compiled(False, None) == compiled(False, 0) != compiled(False, 3)
    assert compiled(True, None) == compiled(True, 3) != compiled(True, 0)
    assert compiled(False, None)[0] is False and compiled(True, None)[0] is True


def test_recomputation_runs_the_segments_between_checkpoints_at_once() -> None:
    # On an IPU, backward recomputes the segments between recomputationCheckpoint marks one at
    # a time, so the transient is one segment's activations; the simulator recomputes the whole
    # stage before differentiating it. The estimate and the measurement count what an IPU holds
    # (see [Note: recomputing one segment at a time] in poptorch_sim/memory/estimate.py).
    from poptorch_sim.memory import measure

    class Net(nn.Module):
        def __init__(self, marked: bool) -> None:
            super().__init__()
            self.a = poptorch.BeginBlock(nn.Linear(8, 32), "a", ipu_id=0)
            self.a2 = nn.Linear(32, 32)
            self.b = poptorch.BeginBlock(nn.Linear(32, 2), "b", ipu_id=1)
            self.marked = marked

        def forward(self, x: torch.Tensor, y: torch.Tensor):
            h = torch.tanh(self.a(x))
            h = poptorch.recomputationCheckpoint(h) if self.marked else h
            out = self.b(torch.tanh(self.a2(h)))
            return out, nn.functional.cross_entropy(out, y)

    def stage_0(marked: bool, recompute: int) -> tuple[Any, int]:
        net = Net(marked)
        opts = poptorch.Options()
        opts.Training.gradientAccumulation(4)
        opts._Popart.set("autoRecomputation", recompute)
        model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
        got = measure(model, torch.randn(16, 8), torch.randint(0, 2, (16,)))[0]
        flight = poptorch.memory_report(model).ipus[0].in_flight[0]
        model.destroy()
        return got, flight

    whole = stage_0(False, 0)[0].activations_per_micro_batch[0]  # one full forward's saves
    got, flight = stage_0(True, 3)
    assert got.recomputed_at_once >= whole  # what the simulator held for a moment
    counted = got.activations - flight * got.activations_per_micro_batch[0]
    assert flight > 1 and 0 < counted < whole  # one segment, as on an IPU


def test_floating_point_exceptions_check_the_forward_pass_only() -> None:
    # sqrt's gradient at 0 is inf: an IPU would trap in the backward pass; only the forward
    # pass is checked here (see poptorch_sim/executor/fp_checks.py).
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return poptorch.identity_loss(torch.sqrt(self.w * x).sum(), reduction="none")

    opts = poptorch.Options()
    opts.Precision.enableFloatingPointExceptions(True)
    model = Net()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training(torch.ones(1, 2))  # no error
    assert not torch.isfinite(model.w).all()  # the update was inf / NaN


def test_synthetic_data_outputs_come_back_and_integer_inputs_are_zeros() -> None:
    # An IPU with synthetic data copies no outputs back and leaves integer streams as its fill
    # left them; here the outputs computed on the synthetic inputs are returned, and integer
    # inputs are zeros (valid labels).
    opts = poptorch.Options().enableSyntheticData(True)
    model = poptorch.inferenceModel(nn.Embedding(5, 2), opts)
    out = model(torch.tensor([3, 4]))
    torch.testing.assert_close(out, model.weight[torch.tensor([0, 0])].detach())
    model.destroy()


def test_anchored_tensors_keep_one_value_per_optimizer_step() -> None:
    # On an IPU an anchor under OutputMode.All has a row per device iteration, accumulation step
    # and replica (DI·GA·R, as an output); the anchored values the simulator makes (gradients,
    # updated weights) exist once per optimizer step, so it returns DI of them.
    opts = poptorch.Options().deviceIterations(3)
    opts.Training.gradientAccumulation(2)
    opts.anchorTensor("grad", "Gradient___bias", poptorch.OutputMode.All)

    class WithLoss(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return poptorch.identity_loss(super().forward(x).square().sum(), "sum")

    training = poptorch.trainingModel(WithLoss(4, 10), opts)
    training(torch.randn(6, 4))
    assert training.getAnchoredTensor("grad").shape == (3 * 10,)
    training.destroy()


class _Noise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn_like(x)


def test_random_numbers_come_from_torch_generators_seeded_per_micro_batch() -> None:
    # An IPU draws from its tiles' hardware generators; here each micro-batch's random ops
    # draw from torch's generator, seeded from the model's own stream (see
    # poptorch_sim/runtime/rng.py): other numbers than an IPU's for one seed, and other
    # numbers than eager PyTorch after torch.manual_seed(seed).
    opts = poptorch.Options().randomSeed(7).deviceIterations(2)
    model = poptorch.inferenceModel(_Noise(), opts)
    out = model(torch.zeros(2, 3))
    torch.manual_seed(7)
    assert not torch.equal(out[0], torch.randn(3))
    assert not torch.equal(out[0], out[1])  # each micro-batch has its own stream
    # rng_state is torch's CPU generator state (mt19937), not PopART's per-tile state
    assert len(model.rng_state) == 1 + torch.get_rng_state().numel()


def test_an_unseeded_model_starts_from_the_host_stream_as_it_stands() -> None:
    # PopART seeds an unseeded model itself; here it starts from a copy of torch's CPU
    # generator at compile (without drawing from it), so torch.manual_seed makes runs repeat.
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(poptorch.inferenceModel(_Noise())(torch.zeros(2, 3)))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


class _NumThreads(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> torch.Tensor:
        if i >= 1:
            raise IndexError(i)  # iter() over a map-style dataset stops here
        return torch.tensor([torch.get_num_threads()])


@pytest.mark.parametrize("strategy", ["ForkServer", "Fork"])
def test_the_accessor_worker_runs_torch_on_one_thread(strategy: str) -> None:
    # PopTorch's worker keeps torch's thread count; here it runs on one thread, as torch's own
    # data-loader workers do, so that a forked worker never enters the OpenMP team it inherited
    # (see [Note: sharing strategies] in poptorch_sim/data/sharing.py).
    accessor = poptorch.AsynchronousDataAccessor(
        _NumThreads(), sharing_strategy=poptorch.SharingStrategy[strategy]
    )
    try:
        assert [int(x) for x in accessor] == [1]
    finally:
        accessor.terminate()
