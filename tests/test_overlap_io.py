"""Overlapped IO: PopTorch's API and errors, IO tiles' results against eager, and the pipeline."""

from __future__ import annotations

import gc
import json
import threading
import weakref

import pytest
import torch
from test_cores import needs_teams, settled_os_threads
from torch import nn

import poptorch_sim as poptorch
from poptorch_sim.errors import Error
from poptorch_sim.profiling.trace import TraceEvent, TraceRecorder
from poptorch_sim.profiling.utilisation import busy_fraction, utilisation
from poptorch_sim.runtime.io_tiles import IoTiles, thread_split

WAIT_S = 20.0  # every wait in these tests is bounded
MODE = poptorch.OverlapMode.OverlapAccumulationLoop


class Overlapped(nn.Module):
    """uint8 images in, float features and an int64 index out; every input/output overlapped."""

    def __init__(self, mode: poptorch.OverlapMode = MODE) -> None:
        super().__init__()
        self.mode = mode
        self.lin = nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = poptorch.set_overlap_for_input(x, self.mode)
        y = torch.relu(self.lin(x.float() / 255))
        return poptorch.set_overlap_for_output((y, y.argmax(dim=1)), self.mode)


class TwoIpus(Overlapped):
    """The same model cut into two blocks on two IPUs (a staged program)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = poptorch.set_overlap_for_input(x, self.mode)
        with poptorch.Block("B0", ipu_id=0):
            h = self.lin(x.float() / 255)
        with poptorch.Block("B1", ipu_id=1):
            y = torch.relu(h)
            idx = y.argmax(dim=1)
        return poptorch.set_overlap_for_output((y, idx), self.mode)


def _options(di: int = 4, tiles: int | None = 32, sharded: bool = True) -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(di)
    if sharded:
        opts.setExecutionStrategy(poptorch.ShardedExecution())
    if tiles is not None:
        opts.TensorLocations.numIOTiles(tiles)
    return opts


def _images(rows: int) -> torch.Tensor:
    return torch.randint(0, 256, (rows, 12), dtype=torch.uint8)


# -- API and PopTorch's messages ------------------------------------------------------------------


@pytest.mark.parametrize("op, what", [(poptorch.set_overlap_for_input, "inputs"),
                                      (poptorch.set_overlap_for_output, "outputs")])  # fmt: skip
def test_overlap_markers_take_tensors_only(op, what):
    with pytest.raises(poptorch.Error, match=f"You may only set overlap for torch.tensor {what}. "
                       "<class 'int'> is not supported."):  # fmt: skip
        op((torch.ones(1), [3]), MODE)


def test_overlap_markers_return_the_same_structure():
    data = {"a": (torch.ones(1), [torch.zeros(2)])}
    assert poptorch.set_overlap_for_input(data, MODE) is data


@pytest.mark.parametrize(
    "sharded, tiles, message",
    [
        # PipelinedExecution is checked first: the default, even for one IPU, no tiles, Final.
        (False, None, "not supported with poptorch.PipelinedExecution. If you are using "
         "only one IPU, please switch to poptorch.ShardedExecution."),
        (True, None, "No IO tiles allocated. You must allocate at least 32 IO tiles using "
         r"poptorch.Options\(\).TensorLocations.numIOTiles."),
        # Training's default output mode is Final.
        (True, 32, "Unsupported output mode for overlapped IO. Please switch output mode "
         "to poptorch.OutputMode.All or poptorch.OutputMode.Sum."),
    ],
    ids=["pipelined-first", "no-io-tiles", "output-mode-final"],
)  # fmt: skip
def test_overlap_errors_in_poptorchs_order(sharded, tiles, message):
    class WithLoss(Overlapped):
        def forward(self, x):
            y, idx = super().forward(x)  # both marked outputs are returned, as PopTorch requires
            return y, idx, poptorch.identity_loss(y.sum(), reduction="none")

    model = poptorch.trainingModel(WithLoss(), _options(tiles=tiles, sharded=sharded))
    with pytest.raises(poptorch.Error, match=message):
        model(_images(8))


@pytest.mark.parametrize("mode", [poptorch.OutputMode.Final, poptorch.OutputMode.EveryN])
def test_inference_output_mode_must_be_all_or_sum(mode):
    opts = _options()
    opts.outputMode(mode, 2) if mode == poptorch.OutputMode.EveryN else opts.outputMode(mode)
    with pytest.raises(poptorch.Error, match="Unsupported output mode for overlapped IO"):
        poptorch.inferenceModel(Overlapped(), opts)(_images(8))


def test_no_overlap_marks_need_no_io_tiles():
    model = poptorch.inferenceModel(
        Overlapped(poptorch.OverlapMode.NoOverlap), _options(tiles=None, sharded=False)
    )
    model(_images(8))
    assert model._executable.io is None


def test_num_io_tiles_is_even_between_32_and_192():
    for bad in (30, 33, 194, 2.0):
        with pytest.raises(
            AssertionError, match="numIOTiles must be an even number between 32 and 192."
        ):
            poptorch.Options().TensorLocations.numIOTiles(bad)
    poptorch.Options().TensorLocations.numIOTiles(192)


# -- results: with overlap == without == eager ----------------------------------------------------


@pytest.mark.parametrize("cls", [Overlapped, TwoIpus], ids=["one-ipu", "two-ipus-sharded"])
@pytest.mark.parametrize("mode", [poptorch.OutputMode.All, poptorch.OutputMode.Sum])
def test_results_with_io_tiles_equal_without_and_eager(cls, mode):
    module = cls()
    x = _images(16)
    results = []
    no_overlap = poptorch.OverlapMode.NoOverlap
    # Overlapped; the same copies just in time (NoOverlap with IO tiles); no copies at all.
    for marks, tiles, threads in ((MODE, 32, 3), (no_overlap, 32, 1), (no_overlap, None, 0)):
        module.mode = marks
        model = poptorch.inferenceModel(module, _options(tiles=tiles).outputMode(mode))
        results.append(model(x))
        io = model._executable.io
        assert (len(io._threads) if io else 0) == threads
        results.append(model(x))  # a second call through the same pipeline
        model.destroy()
    with torch.no_grad():
        y, idx = Overlapped.forward(module, x)
    if mode == poptorch.OutputMode.Sum:
        y, idx = y.reshape(4, 4, 6).sum(0), idx.reshape(4, 4).sum(0)
    for got in results:
        torch.testing.assert_close(got[0], y)
        torch.testing.assert_close(got[1], idx.to(torch.int32))  # the IPU returns int32


def test_float64_inputs_are_loaded_as_float32():
    class Identity(nn.Module):
        def forward(self, x):
            x = poptorch.set_overlap_for_input(x, MODE)
            return poptorch.set_overlap_for_output(x * 1, MODE)

    x = torch.randn(8, 3, dtype=torch.float64)
    model = poptorch.inferenceModel(Identity(), _options())
    out = model(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x.float())
    assert out.data_ptr() != x.data_ptr()
    model.destroy()


def test_concurrent_calls_share_the_io_tiles_and_get_their_own_results():
    module = Overlapped()
    opts = _options()
    opts._Popart.set("defaultPrefetchBufferingDepth", 3)
    model = poptorch.inferenceModel(module, opts)
    inputs = [_images(8) for _ in range(6)]
    model(inputs[0])
    outputs: list = [None] * len(inputs)

    def call(i: int) -> None:
        outputs[i] = model(inputs[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    with torch.no_grad():
        for x, got in zip(inputs, outputs):
            torch.testing.assert_close(got[0], Overlapped.forward(module, x)[0])
    assert [p.maxsize for p in model._executable.io._handovers] == [3, 3]
    model.destroy()


@pytest.mark.parametrize("cls", [Overlapped, TwoIpus])
def test_a_model_dropped_without_destroy_stops_its_io_threads(cls):
    # The IO threads must not keep the model alive: once nothing holds it, it is collected and
    # its threads are stopped and joined, as destroy() would.
    model = poptorch.inferenceModel(cls(), _options())
    model(_images(8))
    io_threads = list(model._executable.io._threads)
    assert len(io_threads) == 3 and all(t.is_alive() for t in io_threads)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    assert not any(t.is_alive() for t in io_threads)


# -- the pipeline itself -------------------------------------------------------------------------


def test_the_next_micro_batch_loads_while_this_one_computes():
    # Compute of micro-batch 0 waits until the load thread has started loading micro-batch 1:
    # it only returns in time if load and compute overlap.
    loading_1 = threading.Event()

    def load(values: torch.Tensor, fn):
        if int(values[0]) == 1:
            loading_1.set()
        return fn(values)

    def compute(values: torch.Tensor, replica: int) -> list[torch.Tensor]:
        if int(values[0]) == 0 and not loading_1.wait(WAIT_S):
            raise AssertionError("micro-batch 1 was not loaded while micro-batch 0 computed")
        return [values + 10]

    io = IoTiles(compute, load, torch.device("cpu"), 32, 1)
    try:
        out = io.run([(0, torch.tensor([m])) for m in range(4)])
    finally:
        io.close()
    assert [int(o[0]) for o in out] == [10, 11, 12, 13]


def test_a_failing_call_fails_alone_and_the_pipeline_keeps_serving():
    def compute(values: torch.Tensor, replica: int) -> list[torch.Tensor]:
        if int(values[0]) < 0:
            raise ValueError("negative micro-batch")
        return [values * 2]

    io = IoTiles(compute, lambda v, fn: fn(v), torch.device("cpu"), 32, 1)
    results: dict[str, object] = {}

    def call(name: str, first: int) -> None:
        try:
            results[name] = io.run([(0, torch.tensor([first + k])) for k in range(5)])
        except Error as exc:
            results[name] = exc

    try:
        threads = [
            threading.Thread(target=call, args=(n, f)) for n, f in (("bad", -2), ("good", 1))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert isinstance(results["bad"], Error)
        assert "compute of micro-batch 0" in str(results["bad"])
        assert isinstance(results["bad"].__cause__, ValueError)
        assert [int(o[0][0]) for o in results["good"]] == [2, 4, 6, 8, 10]
        assert [int(o[0][0]) for o in io.run([(0, torch.tensor([7]))])] == [14]
    finally:
        io.close()
    with pytest.raises(Error, match="closed"):
        io.run([(0, torch.tensor([1]))])


def test_just_in_time_io_runs_the_phases_one_after_the_other():
    trace = TraceRecorder()
    io = IoTiles(
        lambda v, r: [v * 3], lambda v, fn: fn(v), torch.device("cpu"), 32, 1,
        trace=trace, overlap=False,
    )  # fmt: skip
    try:
        out = io.run([(0, torch.tensor([m], dtype=torch.float64)) for m in range(3)])
    finally:
        io.close()
    assert [o[0].dtype for o in out] == [torch.float32] * 3  # loaded as float32
    assert [float(o[0]) for o in out] == [0.0, 3.0, 6.0]
    spans = sorted(trace.events, key=lambda e: e.start_us)
    assert [e.track for e in spans] == ["load", "compute", "store"] * 3
    assert all(a.end_us <= b.start_us for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("threads, tiles, split", [(1, 192, (1, 1)), (2, 32, (2, 1)),
                                                   (2, 192, (2, 1)), (16, 192, (14, 2)),
                                                   (16, 32, (16, 1)), (64, 192, (56, 5))])  # fmt: skip
def test_io_tiles_take_their_share_of_the_threads(threads, tiles, split):
    assert thread_split(threads, tiles) == split


# -- the profile shows it ------------------------------------------------------------------------


def test_trace_has_load_compute_store_tracks_and_a_utilisation_plot(tmp_path):
    opts = _options().enableProfiling(str(tmp_path))
    model = poptorch.inferenceModel(Overlapped(), opts)
    model(_images(8))
    trace = model._executable.io.trace
    model.destroy()
    events = trace.events
    for m in range(4):
        load, compute, store = (
            next(e for e in events if e.track == t and e.mb == m)
            for t in ("load", "compute", "store")
        )
        assert load.end_us <= compute.start_us and compute.end_us <= store.start_us
    written = list(tmp_path.glob("overlap_io_trace_*.json"))
    assert len(written) == 1 and written[0].with_suffix(".png").stat().st_size > 0
    chrome = json.loads(written[0].read_text())
    names = {e["args"]["name"] for e in chrome["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"IPU 0 load", "IPU 0 compute", "IPU 0 store"}


def test_trace_tracks_without_io_keep_their_ipu_ids():
    rec = TraceRecorder()
    rec.record(1, "1F0", "fwd", 0, 1000, stage=1, mb=0)
    rec.record(0, "0F0", "fwd", 0, 1000, stage=0, mb=0)
    tids = {e["tid"] for e in rec.to_chrome()["traceEvents"] if e["ph"] == "X"}
    assert tids == {0, 1}


def test_utilisation_bins_spans():
    events = [
        TraceEvent(0, "L0", "load", 0.0, 1000.0, track="load"),
        TraceEvent(0, "C0", "compute", 1000.0, 1000.0, track="compute"),
        TraceEvent(0, "L1", "load", 1000.0, 500.0, track="load"),
    ]
    times, busy = utilisation(events, bins=2)
    assert times == [0.5, 1.5]
    assert busy == {"IPU 0 compute": [0.0, 1.0], "IPU 0 load": [1.0, 0.5]}
    assert busy_fraction(events) == {"IPU 0 compute": 0.5, "IPU 0 load": 0.75}


class _Wide(nn.Module):
    """Ops large enough to run as 2-thread parallel regions."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1024, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = poptorch.set_overlap_for_input(x, MODE)
        return poptorch.set_overlap_for_output(torch.relu(self.lin(x)), MODE)


@needs_teams
def test_io_tile_threads_free_their_intra_op_teams_when_idle(monkeypatch):
    """See [Note: idle teams slow every team]: an IPU on 2 intra-op threads leaves as many
    threads behind after a call as one on 1."""
    x = torch.randn(4 * 256, 1024)
    counts = []
    for threads in ("1", "2"):
        monkeypatch.setenv("POPTORCH_SIM_THREADS_PER_IPU", threads)
        model = _Wide()
        overlapped = poptorch.inferenceModel(model, _options(di=4, tiles=32))
        out = overlapped(x)
        counts.append(settled_os_threads())
        overlapped.destroy()
        with torch.no_grad():
            torch.testing.assert_close(out, model(x))
    assert counts[1] == counts[0]
