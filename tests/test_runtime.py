"""The pipeline runtime: transparency against eager PyTorch, failures, threads and the trace."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn

from poptorch_sim.errors import Error
from poptorch_sim.profiling.trace import TraceRecorder
from poptorch_sim.program import StagedProgram, StageSpec
from poptorch_sim.runtime import PipelineRuntime, default_devices
from poptorch_sim.runtime.routes import HOST, routes_of

CPU = {i: torch.device("cpu") for i in range(4)}
WIDTH = 8


# -- stage modules (each returns a tuple, one value per output name) -------------------------------


class Dense(nn.Module):
    """Linear + ReLU."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.relu(self.fc(x)),)


class Fork(nn.Module):
    """Dense, also sending its input ahead as a skip connection."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc(x))
        return h, torch.tanh(h)


class Join(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.relu(self.fc(h)) + skip,)


class Loss(nn.Module):
    """Head: logits and the MSE loss against the target."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, 3)

    def forward(self, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.fc(h)
        return logits, nn.functional.mse_loss(logits, y)


def chain(num_dense: int, ipus: list[int] | None = None) -> StagedProgram:
    """``num_dense`` Dense stages then the loss stage."""
    ipus = ipus or list(range(num_dense + 1))
    stages = [
        StageSpec(i, ipus[i], Dense(), ("x" if i == 0 else f"h{i}",), (f"h{i + 1}",))
        for i in range(num_dense)
    ]
    stages.append(
        StageSpec(num_dense, ipus[num_dense], Loss(), (f"h{num_dense}", "y"), ("logits", "loss"))
    )
    return StagedProgram(stages, ("x", "y"), ("logits", "loss"), loss_name="loss")


def skip() -> StagedProgram:
    """Stage 0's second output skips stage 1; stage 2 reads the target straight from the host."""
    stages = [
        StageSpec(0, 0, Fork(), ("x",), ("h1", "s")),
        StageSpec(1, 1, Dense(), ("h1",), ("h2",)),
        StageSpec(2, 2, Join(), ("h2", "s"), ("h3",)),
        StageSpec(3, 3, Loss(), ("h3", "y"), ("logits", "loss")),
    ]
    return StagedProgram(stages, ("x", "y"), ("s", "logits", "loss"), loss_name="loss")


def fan_out() -> StagedProgram:
    """Stage 0's output feeds stage 1 and stage 2: its gradients from both are summed."""
    stages = [
        StageSpec(0, 0, Dense(), ("x",), ("h1",)),
        StageSpec(1, 1, Dense(), ("h1",), ("h2",)),
        StageSpec(2, 2, Join(), ("h2", "h1"), ("h3",)),
        StageSpec(3, 3, Loss(), ("h3", "y"), ("logits", "loss")),
    ]
    return StagedProgram(stages, ("x", "y"), ("logits", "loss"), loss_name="loss")


LAYOUTS: dict[str, Callable[[], StagedProgram]] = {
    "2-stages": lambda: chain(1),
    "4-stages": lambda: chain(3),
    "skip": skip,
    "fan-out": fan_out,
    "head-on-ipu0": lambda: chain(3, [0, 1, 2, 0]),
}


def micro_batches(count: int) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.randn(4, WIDTH), "y": torch.randn(4, 3)} for _ in range(count)]


def eager(program: StagedProgram, batches, loss_scale: float = 1.0, training: bool = True):  # type: ignore[no-untyped-def]
    """The oracle: run the stages in order per micro-batch, backward from loss * loss_scale."""
    outputs = []
    for values in batches:
        env = dict(values)
        with torch.set_grad_enabled(training):
            for spec in program.stages:
                env.update(zip(spec.outputs, spec.module(*(env[n] for n in spec.inputs))))
        if training:
            (env[program.loss_name] * loss_scale).backward()
        outputs.append({n: env[n].detach() for n in program.output_names})
    return outputs


def grads(program: StagedProgram) -> dict[str, torch.Tensor]:
    return {
        f"{spec.index}.{name}": p.grad.clone()
        for spec in program.stages
        for name, p in spec.module.named_parameters()
        if p.grad is not None
    }


# -- routes ---------------------------------------------------------------------------------------


def test_routes_follow_values_across_stages() -> None:
    routes = routes_of(skip())
    assert routes.inputs_from[2] == {1: ("h2",), 0: ("s",)}
    assert routes.inputs_from[3] == {2: ("h3",), HOST: ("y",)}
    assert routes.outputs_to[0] == {1: ("h1",), 2: ("s",)}
    assert routes.to_host == (("s",), (), (), ("logits", "loss"))
    assert routes.loss_stage == 3


def _spec(index: int, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> StageSpec:
    return StageSpec(index, index, Dense(), inputs, outputs)


@pytest.mark.parametrize(
    "stages, outputs, message",
    [
        ([_spec(0, ("x",), ("h",)), _spec(1, ("h",), ("h",))], ("h",),
         "value 'h' is produced by stage 1 but is already stage 0"),
        ([_spec(0, ("x",), ("x",))], ("x",), "value 'x' is produced by stage 0 but is already a "
         "program input"),
        ([_spec(0, ("h",), ("a",)), _spec(1, ("x",), ("h",))], ("a",),
         "stage 0 reads 'h', which is made by stage 1; a stage may only read"),
        ([_spec(0, ("x",), ("a",))], ("b",), "program output 'b' is not made by any stage"),
        ([_spec(1, ("x",), ("a",))], ("a",), r"stages must be numbered 0..N-1 in order, got "
         r"indices \[1\]"),
        ([], (), "the staged program has no stages"),
    ],
    ids=["produced-twice", "shadows-input", "reads-later-stage", "unmade-output", "numbering",
         "empty"],
)  # fmt: skip
def test_malformed_programs_are_rejected(stages, outputs, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Error, match=message):
        routes_of(StagedProgram(stages, ("x",), outputs))


# -- transparency ------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [7, 16], ids=["M7", "M16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("schedule", ["1f1b", "fill_drain", "sharded"])
def test_training_matches_eager(schedule: str, layout: str, count: int) -> None:
    program = LAYOUTS[layout]()
    program.sharded = schedule == "sharded"
    reference = copy.deepcopy(program)
    batches = micro_batches(count)
    want = eager(reference, batches, loss_scale=0.25)
    with PipelineRuntime(
        program, training=True, schedule="1f1b" if program.sharded else schedule, devices=CPU
    ) as runtime:
        got = runtime.run(batches, loss_scale=0.25)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads(program), grads(reference))
    assert len(grads(program)) == 2 * len(program.stages)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("sharded", [False, True], ids=["pipelined", "sharded"])
def test_inference_matches_eager(sharded: bool, layout: str) -> None:
    program = LAYOUTS[layout]()
    program.sharded = sharded
    batches = micro_batches(7)
    want = eager(program, batches, training=False)
    with PipelineRuntime(program, training=False, devices=CPU) as runtime:
        got = runtime.run(batches)
    torch.testing.assert_close(got, want)
    assert all(p.grad is None for p in program.stages[0].module.parameters())


def test_outputs_are_detached_host_tensors_in_output_order() -> None:
    program = skip()
    with PipelineRuntime(program, training=True, devices=CPU) as runtime:
        out = runtime.run(micro_batches(3))
    assert [list(o) for o in out] == [["s", "logits", "loss"]] * 3
    assert all(not t.requires_grad and t.device.type == "cpu" for o in out for t in o.values())


def sgd(module: nn.Module, lr: float = 0.1) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p -= lr * p.grad


@pytest.mark.parametrize("schedule", ["1f1b", "fill_drain"])
def test_per_stage_step_matches_an_eager_optimizer_step(schedule: str) -> None:
    """step(stage) runs on the stage's thread after its last backward, with full gradients."""
    program = chain(3)
    reference = copy.deepcopy(program)
    batches = micro_batches(6)
    eager(reference, batches, loss_scale=1 / 6)
    for spec in reference.stages:
        sgd(spec.module)
    seen: list[tuple[int, str]] = []

    def step(stage: int) -> None:
        seen.append((stage, threading.current_thread().name))
        sgd(program.stages[stage].module)

    with PipelineRuntime(program, training=True, schedule=schedule, devices=CPU) as runtime:
        runtime.run(batches, loss_scale=1 / 6, step=step)
    assert sorted(seen) == [(s, f"poptorch_sim IPU {s}") for s in range(4)]
    for ours, theirs in zip(program.stages, reference.stages):
        torch.testing.assert_close(ours.module.state_dict(), theirs.module.state_dict())


def test_runtime_is_reusable_and_gradients_keep_accumulating() -> None:
    program = chain(1)
    reference = copy.deepcopy(program)
    first, second = micro_batches(4), micro_batches(5)
    eager(reference, first + second)
    with PipelineRuntime(program, training=True, devices=CPU) as runtime:
        runtime.run(first)
        runtime.run(second)
    torch.testing.assert_close(grads(program), grads(reference))


def test_graph_module_stages_run() -> None:
    program = chain(1)
    program.stages[0] = StageSpec(0, 0, fx.symbolic_trace(Dense()), ("x",), ("h1",))
    reference = copy.deepcopy(program)
    batches = micro_batches(3)
    with PipelineRuntime(program, training=True, devices=CPU) as runtime:
        torch.testing.assert_close(runtime.run(batches), eager(reference, batches))
    torch.testing.assert_close(grads(program), grads(reference))


# -- failures -------------------------------------------------------------------------------------


class FailAt(nn.Module):
    """Dense that raises on one micro-batch (counted per call) in forward, backward or both."""

    def __init__(self, at: int, where: str = "forward") -> None:
        super().__init__()
        self.inner, self.at, self.where, self.calls = Dense(), at, where, 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.calls += 1
        if self.where == "forward" and self.calls == self.at + 1:
            raise ValueError("boom in the stage")
        (y,) = self.inner(x)
        if self.where == "backward" and self.calls == self.at + 1:
            y = _RaiseInBackward.apply(y)
        return (y,)


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        raise RuntimeError("boom in backward")


def failing_program(where: str, at: int = 3) -> StagedProgram:
    program = chain(3)
    program.stages[1] = StageSpec(1, 1, FailAt(at, where), ("h1",), ("h2",))
    return program


@pytest.mark.parametrize("schedule", ["1f1b", "fill_drain", "sharded"])
def test_stage_failure_names_stage_ipu_and_microbatch(schedule: str) -> None:
    program = failing_program("forward")
    program.sharded = schedule == "sharded"
    baseline = threading.active_count()
    runtime = PipelineRuntime(
        program, training=True, schedule="1f1b" if program.sharded else schedule, devices=CPU
    )
    with pytest.raises(
        Error,
        match=r"stage 1 \(IPU 1\) failed in forward of micro-batch 3: "
        r"ValueError: boom in the stage",
    ) as info:
        runtime.run(micro_batches(8))
    assert isinstance(info.value.__cause__, ValueError)
    runtime.close()
    assert threading.active_count() == baseline
    program.stages[1].module.at = -1  # now it works: a fresh runtime over the same program runs
    with PipelineRuntime(program, training=True, devices=CPU) as again:
        assert len(again.run(micro_batches(8))) == 8


def test_same_runtime_runs_again_after_a_failure() -> None:
    program = failing_program("forward", at=2)
    with PipelineRuntime(program, training=True, devices=CPU) as runtime:
        with pytest.raises(Error, match="micro-batch 2"):
            runtime.run(micro_batches(6))
        program.stages[1].module.at = -1
        for spec in program.stages:
            spec.module.zero_grad()
        reference = copy.deepcopy(program)
        batches = micro_batches(6)
        torch.testing.assert_close(runtime.run(batches), eager(reference, batches))
    torch.testing.assert_close(grads(program), grads(reference))


def test_a_vanished_worker_thread_is_an_error_not_a_hang() -> None:
    runtime = PipelineRuntime(chain(3), training=True, devices=CPU)
    runtime._workers[2].inbox.put("STOP")  # the thread leaves as if it had crashed
    runtime._workers[2].thread.join()
    with pytest.raises(Error, match=r"worker threads of IPUs \[2\] stopped in the middle"):
        runtime.run(micro_batches(4))
    with pytest.raises(Error, match="this PipelineRuntime is unusable"):
        runtime.run(micro_batches(4))
    runtime.close()


def test_backward_failure_is_reported() -> None:
    with PipelineRuntime(failing_program("backward", at=4), training=True, devices=CPU) as rt:
        with pytest.raises(
            Error,
            match=r"stage 1 \(IPU 1\) failed in backward of micro-batch 4: "
            "RuntimeError: boom in backward",
        ):
            rt.run(micro_batches(8))


def test_step_failure_is_reported() -> None:
    def step(stage: int) -> None:
        if stage == 2:
            raise KeyError("no optimizer for stage 2")

    with PipelineRuntime(chain(3), training=True, devices=CPU) as runtime:
        with pytest.raises(Error, match=r"stage 2 \(IPU 2\) failed in optimizer step: KeyError"):
            runtime.run(micro_batches(4), step=step)


class Matmul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        h = torch.relu(x)
        return (torch.matmul(h, self.w),)


def test_graph_node_is_named_for_fx_stages() -> None:
    program = chain(1)
    program.stages[0] = StageSpec(0, 0, fx.symbolic_trace(Matmul()), ("x",), ("h1",))
    batches = micro_batches(4)
    batches[2]["x"] = torch.randn(4, WIDTH + 1)
    with PipelineRuntime(program, training=True, devices=CPU) as runtime:
        with pytest.raises(
            Error,
            match=r"(?s)stage 0 \(IPU 0\) failed in forward of micro-batch "
            r"2: RuntimeError: .*While executing %matmul",
        ):
            runtime.run(batches)


def test_keyboard_interrupt_stops_the_run_cleanly() -> None:
    # Ctrl-C lands in the caller while it waits for the workers' reports. It is raised there
    # deterministically once stage 2 is busy, rather than by _thread.interrupt_main(), whose
    # delivery waits for the main thread's next bytecode and is swallowed if that happens inside
    # a finaliser run by the garbage collector (seen under load).
    busy = threading.Event()

    class Busy(nn.Module):
        def forward(self, h: torch.Tensor) -> tuple[torch.Tensor]:
            busy.set()
            return (h,)

    program = chain(3)
    program.stages[2] = StageSpec(2, 2, Busy(), ("h2",), ("h3",))
    baseline = threading.active_count()
    runtime = PipelineRuntime(program, training=True, devices=CPU)
    reports = runtime._reports
    real_get, interrupted = reports.get, []

    def get(*args: Any, **kwargs: Any) -> Any:
        if busy.is_set() and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt  # what Ctrl-C does to the caller
        return real_get(*args, **kwargs)

    reports.get = get  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        runtime.run(micro_batches(8))
    assert interrupted == [True]
    assert len(runtime.run(micro_batches(8))) == 8  # the run was stopped; the runtime works
    runtime.close()
    assert threading.active_count() == baseline


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: PipelineRuntime(chain(1), training=True, schedule="zigzag", devices=CPU),
            "unknown pipeline schedule 'zigzag'",
        ),
        (
            lambda: PipelineRuntime(dataclass_replace_loss(chain(1)), training=True, devices=CPU),
            "training needs the program's loss_name",
        ),
        (
            lambda: PipelineRuntime(chain(1), training=True, devices={0: torch.device("cpu")}),
            r"devices has no entry for IPUs \[1\]",
        ),
        (
            lambda: PipelineRuntime(chain(1), training=True, devices=CPU, threads_per_ipu=0),
            "threads_per_ipu must be at least 1",
        ),
    ],
    ids=["schedule", "no-loss", "devices", "threads"],
)
def test_bad_configuration_is_rejected(build: Callable[[], PipelineRuntime], message: str) -> None:
    baseline = threading.active_count()
    with pytest.raises(Error, match=message):
        build()
    assert threading.active_count() == baseline


def dataclass_replace_loss(program: StagedProgram) -> StagedProgram:
    program.loss_name = None
    return program


def test_bad_inputs_and_closed_runtime() -> None:
    runtime = PipelineRuntime(chain(1), training=True, devices=CPU)
    with pytest.raises(Error, match=r"micro-batch 1 has inputs \['x'\] but the program takes"):
        runtime.run([{"x": torch.ones(4, WIDTH), "y": torch.ones(4, 3)}, {"x": torch.ones(1)}])
    runtime.close()
    runtime.close()
    with pytest.raises(Error, match="this PipelineRuntime is closed"):
        runtime.run(micro_batches(2))


def test_stage_must_return_a_tuple() -> None:
    program = chain(1)
    program.stages[0] = StageSpec(0, 0, nn.Linear(WIDTH, WIDTH), ("x",), ("h1",))
    with PipelineRuntime(program, training=True, devices=CPU) as runtime:
        with pytest.raises(
            Error,
            match=r"stage 0 must return a tuple of 1 values \(\['h1'\]\), "
            "got Tensor",
        ):
            runtime.run(micro_batches(2))


# -- threads ------------------------------------------------------------------------------------


def test_thread_count_stays_flat_over_many_runtimes() -> None:
    baseline = threading.active_count()
    for i in range(20):
        runtime = PipelineRuntime(chain(3, [0, 1, 0, 1]), training=True, devices=CPU)
        runtime.run(micro_batches(4))
        if i % 2:
            runtime.close()
        else:
            del runtime  # the finalizer stops the workers of a forgotten runtime
        assert threading.active_count() <= baseline + 2
    deadline = time.monotonic() + 10
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == baseline


class RecordThreads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.seen.append(torch.get_num_threads())
        return (x + 1,)


@pytest.mark.parametrize(
    "explicit, env, want",
    [(1, None, 1), (None, "1", 1), (2, "1", 2)],
    ids=["argument", "environment", "argument-wins"],
)
def test_each_worker_sets_its_own_intra_op_threads(
    explicit: int | None, env: str | None, want: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is not None:
        monkeypatch.setenv("POPTORCH_SIM_THREADS_PER_IPU", env)
    main_threads = torch.get_num_threads()
    probe = RecordThreads()
    program = StagedProgram([StageSpec(0, 0, probe, ("x",), ("y",))], ("x",), ("y",))
    with PipelineRuntime(program, training=False, devices=CPU, threads_per_ipu=explicit) as rt:
        rt.run([{"x": torch.ones(2)}] * 2)
        fresh: list[int] = []
        t = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
        t.start()
        t.join()
    assert probe.seen == [want, want]
    assert torch.get_num_threads() == main_threads
    assert fresh == [main_threads]  # the process-wide default was restored


# -- trace ----------------------------------------------------------------------------------------


class Sleepy(nn.Module):
    """Dense that also sleeps (releasing the GIL), so overlap shows on a loaded machine."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Dense()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        time.sleep(0.01)
        return self.inner(x)


def sleepy_program() -> StagedProgram:
    program = chain(2)
    for i in range(2):
        program.stages[i] = StageSpec(
            i, i, Sleepy(), program.stages[i].inputs, program.stages[i].outputs
        )
    return program


def overlapping(events, a: int, b: int) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    compute = [e for e in events if e.category in ("fwd", "bwd")]
    return [
        (x.name, y.name)
        for x in compute
        if x.ipu == a
        for y in compute
        if y.ipu == b and x.start_us < y.end_us and y.start_us < x.end_us
    ]


def test_trace_shows_stages_running_concurrently(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # one thread each: lent cores may let one sleeping stage hold both while the other waits
    trace = TraceRecorder()
    program = sleepy_program()
    with PipelineRuntime(
        program, training=True, devices=CPU, trace=trace, threads_per_ipu=1
    ) as rt:
        rt.run(micro_batches(6))
    timeline = trace.timeline()
    assert overlapping(trace.events, 0, 1), f"IPU 0 and IPU 1 never overlapped:\n{timeline}"
    assert [row[:6] for row in timeline.splitlines()] == ["IPU 0 ", "IPU 1 ", "IPU 2 "]
    names = {e.name for e in trace.events}
    assert {"0F5", "1B5", "2STEP", "1RECV_F0", "0SEND_F0"} <= names
    path = trace.write(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    meta = {(e["name"], e.get("tid")): e["args"] for e in data["traceEvents"] if e["ph"] == "M"}
    assert meta[("thread_name", 1)] == {"name": "IPU 1"}
    complete = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in complete} == {0, 1, 2}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    assert "imbalance" in trace.summary()
    assert set(trace.stage_times()) == {0, 1, 2}


def test_sharded_trace_has_one_stage_computing_at_a_time() -> None:
    program = sleepy_program()
    program.sharded = True
    trace = TraceRecorder()
    with PipelineRuntime(program, training=False, devices=CPU, trace=trace) as rt:
        rt.run(micro_batches(4))
    assert not overlapping(trace.events, 0, 1)
    assert not overlapping(trace.events, 1, 2)


# -- devices ------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only placement")
def test_without_cuda_every_ipu_is_the_cpu() -> None:
    assert default_devices([0, 1, 3]) == {i: torch.device("cpu") for i in (0, 1, 3)}
    with PipelineRuntime(chain(1), training=True) as runtime:
        assert runtime.devices == {0: torch.device("cpu"), 1: torch.device("cpu")}


CUDA_LAYOUTS = {
    "default": None,  # IPU i -> cuda:(i mod n)
    "mixed": {0: "cuda:0", 1: "cpu", 2: "cuda:0", 3: "cpu"},  # transfers both ways
}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("placement", list(CUDA_LAYOUTS))
def test_training_on_cuda_matches_eager_on_cpu(placement: str) -> None:
    program = skip()
    reference = copy.deepcopy(program)
    batches = micro_batches(7)
    want = eager(reference, batches, loss_scale=0.5)
    devices = CUDA_LAYOUTS[placement]
    placed = {i: torch.device(d) for i, d in devices.items()} if devices else None
    with PipelineRuntime(program, training=True, devices=placed) as runtime:
        assert runtime.devices[0].type == "cuda"
        got = runtime.run(batches, loss_scale=0.5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    ours = {k: v.cpu() for k, v in grads(program).items()}
    torch.testing.assert_close(ours, grads(reference), rtol=1e-4, atol=1e-5)


class RecordThreadName(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.names.add(threading.current_thread().name)
        return (x * 2,)


def test_a_sharded_program_on_the_cpu_runs_on_one_thread() -> None:
    """See [Note: one thread for a sharded program]: every stage computes on one worker thread;
    the trace and the thread counters still name each stage's IPU; the outputs are the same."""
    probes = [RecordThreadName() for _ in range(3)]
    names = ["x", "h1", "h2", "y"]
    stages = [
        StageSpec(i, ipu, probes[i], (names[i],), (names[i + 1],))
        for i, ipu in enumerate([0, 2, 1])
    ]
    program = StagedProgram(stages, ("x",), ("y",), sharded=True)
    trace = TraceRecorder()
    with PipelineRuntime(program, training=False, devices=CPU, trace=trace) as rt:
        out = rt.run([{"x": torch.full((2,), float(m))} for m in range(3)])
    assert [p.names for p in probes] == [{"poptorch_sim IPU 0, 1, 2"}] * 3
    assert {(e.ipu, e.stage) for e in trace.events if e.category == "fwd"} == {
        (0, 0),
        (2, 1),
        (1, 2),
    }
    assert {ipu for _, ipu, name, _ in trace.counters if name == "threads"} == {0, 1, 2}
    for m in range(3):
        torch.testing.assert_close(out[m]["y"], torch.full((2,), 8.0 * m))
