"""``PoplarExecutor``: what ``trainingModel`` and ``inferenceModel`` return.

It joins the compiler and the runtime, and is built from parts, each handed what it needs:

    part                  module              does
    build_executable      compilation.py      inputs + options → Executable (program, trainer, IO)
    Executable            executable.py       one call: micro-batches through the program
    DeviceLink            device_link.py      attach state, host ↔ device weight copies
    OptimizerLink         optimizer_link.py   the user's optimizer, setOptimizer, device state
    inspection            inspection.py       tensor names, anchors, latencies, placement
    serialization         serialization.py    executable files (save / loadExecutable)

The executor owns the lifecycle (compile, attach/detach, destroy) and PopTorch's method names.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from typing import Any

import torch
from torch import nn

from ..compat.overwrite import substitutions
from ..enums import ConnectionType
from ..errors import NO_EXECUTABLE_ERR, Error
from ..logger import logger
from ..options import Options
from ..options.session import log_options
from ..printing import module_repr
from . import hooks, inspection, serialization
from .batchnorm import frozen_running_stats
from .compilation import build_executable
from .device_link import DeviceLink
from .device_tree import shallow_copy
from .executable import Executable
from .inputs import ArgsParser, BoundArgs, validate_inputs
from .inspection import AllReduceStats, Placement, StagedParts
from .layout import check_batch
from .optimizer_link import OptimizerLink
from .perf import PerfRecord, counters
from .progress import CompilationBar
from .replica_groups import GroupingHandle, ReplicaGrouping
from .synthetic import synthetic_data

__all__ = ["PoplarExecutor", "allreduce_stats", "placement", "staged_parts"]


class PoplarExecutor:
    """A model wrapped for a simulated IPU. Never constructed directly: use
    ``poptorch.trainingModel`` or ``poptorch.inferenceModel`` (which resolve the options).
    """

    def __init__(
        self,
        model: nn.Module,
        options: Options,
        training: bool,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        object.__setattr__(self, "_user_model", model)
        # PopTorch wraps copy.copy(model): see [Note: what the device copies].
        self._model_snapshot = shallow_copy(model)
        self._options = options
        self._training = training
        self._parser = ArgsParser(model)
        self._synthetic = synthetic_data(
            self._options._popart.options, getattr(self._options, "random_seed", None)
        )
        self._executable: Executable | None = None
        self._perf: PerfRecord | None = None
        self._rng_pending: list[int] | None = None  # written to the device RNG at attach
        self._call_lock = threading.RLock()  # See [Note: calls from several threads]
        self._per_replica: dict[str, ReplicaGrouping] = {}  # replicaGrouping() per parameter
        self._optim = OptimizerLink(model, self._options, optimizer) if training else None
        self._link = DeviceLink(model, training, self, self._options)
        self._link.hook_host()

    # -- calling --------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # [Note: calls from several threads]
        # Compiling, attaching and weight syncs happen under a lock, and so does a whole call
        # of a program without IO tiles. With IO tiles (overlapped IO, inference) the run itself
        # is left to the IO threads, which interleave the micro-batches of concurrent calls
        # (see runtime/io_tiles.py); that is what poptorch_sim.serving.Runner relies on.
        with self._call_lock:
            bound = self._parser(args, kwargs)
            if self._synthetic is not None:
                bound = self._synthetic.bind(bound)  # the host's data is not sent
            if self._options.connection_type == ConnectionType.Never:
                raise AssertionError(
                    "Trying to run a model on an offline device (ConnectionType.Never): use "
                    "model.compile(inputs) instead of model(inputs)"
                )
            if self._executable is None:
                self._compile(bound)
            else:
                validate_inputs(self._executable.inputs, bound)
            if not self._link.attached:
                self.attachToDevice()
            if not self._training:
                self._link.follow_training_weights()
            exe = self._require_executable()
            if exe.io is None:
                return self._run(exe, bound)
        return self._run(exe, bound)

    def _run(self, exe: Executable, bound: BoundArgs) -> Any:
        check_batch(bound, exe.layout)
        if exe.trainer is not None and self._optim is not None:
            self._optim.write_state_if_loaded()  # a loaded state goes up before the run uses it
        with substitutions(), self._inference_norms():  # both as at compile
            outputs, self._perf = exe.run(bound, self._options)
        if exe.timing is not None and self._options._Popart.options.get(
            "instrumentWithHardwareCycleCounter"
        ):
            logger.debug("Total number of IPU cycles: %d", exe.timing.cycles)
        if exe.trainer is not None:
            self._link.mark_trained()
            if self._optim is not None:
                self._optim.after_run()
        return outputs

    # -- compiling ------------------------------------------------------------------------------
    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compile for these inputs without running (the device is attached unless
        ``connectionType`` is OnDemand or Never)."""
        if self._executable is not None:
            logger.warning("Call to compile() ignored: the executable is already compiled")
            return
        self._compile(self._parser(args, kwargs))

    def _compile(self, bound: BoundArgs) -> None:
        start = datetime.datetime.now()
        log_options(self._options.toDict())
        bar = CompilationBar(self._options._show_compilation_progress_bar)
        hooks.run_pre_compile()
        self._link.hook_host()
        with substitutions(), self._inference_norms():  # see compat/overwrite.py, batchnorm.py
            exe = build_executable(
                bound,
                self._user_model,
                self._model_snapshot,
                self._options,
                self._training,
                self._optim.build_trainer if self._optim is not None else None,
                bar,
                self._link.claim,
                per_replica=self.__dict__.get("_per_replica"),
            )
        self._memory_report = exe.memory  # read by poptorch_sim.memory_report
        self._time_report = exe.timing  # read by poptorch_sim.time_report and cycleCount
        self._executable = exe
        self._link.connect(exe.device, exe.program.buffers)
        seeded = self._options.exists("random_seed")
        self._rng_pending = [self._options.random_seed] if seeded else None
        if self._optim is not None:
            self._optim.connect(exe)
        hooks.run_post_compile()
        bar.finish()
        self._compilation_time = datetime.datetime.now() - start
        if self._options.connection_type == ConnectionType.Always:
            self._attach()

    def _inference_norms(self) -> contextlib.AbstractContextManager[None]:
        """An inference model's training-mode BatchNorms keep their running statistics."""
        return contextlib.nullcontext() if self._training else frozen_running_stats(self.model)

    def isCompiled(self) -> bool:
        """Whether the model has been compiled (and not destroyed)."""
        return self._executable is not None

    def compilationTime(self) -> datetime.timedelta:
        """How long compilation took."""
        if self._executable is None:
            raise Error("Please compile the model before obtaining compilation time.")
        if not self._options._show_compilation_progress_bar:
            raise Error("Please set showCompilationProgressBar option to obtain compilation time.")
        return self._compilation_time

    # -- device attachment ----------------------------------------------------------------------
    def _require_executable(self) -> Executable:
        if self._executable is None:
            raise Error(NO_EXECUTABLE_ERR)
        return self._executable

    def _attach(self) -> None:
        self._link.attach()
        if self._rng_pending is not None:  # PopTorch writes its cached RNG state at attach
            self._write_rng(self._rng_pending)
            self._rng_pending = None
        if self._optim is not None:
            self._optim.write_state_if_loaded()  # a state loaded while detached goes up now

    def attachToDevice(self) -> None:
        """Attach again and upload the host weights (and optimizer state)."""
        self._require_executable()
        if self._link.attached:
            raise Error("Device is already attached")
        if self._options.connection_type == ConnectionType.Never:
            raise AssertionError("Trying to attach to an offline device (ConnectionType.Never)")
        self._attach()

    def detachFromDevice(self) -> None:
        """Read weights (training), the optimizer state and the RNG state back to the host and
        release the device."""
        self._require_executable()
        if not self._link.attached:
            raise Error("Device is not attached")
        # PopTorch reads the RNG and optimizer states back here and writes them at attach.
        self._rng_pending = self.rng_state
        if self._optim is not None:
            self._optim.read_state_for_detach()
        self._link.detach()
        logger.debug("Detached from device")

    def isAttachedToDevice(self) -> bool:
        """Whether the device is attached (False when not compiled)."""
        return self._executable is not None and self._link.attached

    # -- weights --------------------------------------------------------------------------------
    def copyWeightsToDevice(self) -> None:
        """Upload the host model's weights and buffers, discarding the device's own values."""
        self._require_executable()
        self._link.copy_to_device()

    def copyWeightsToHost(self) -> None:
        """Download the device's weights and buffers into the host model."""
        self._require_executable()
        self._link.copy_to_host()

    def copyWeightsToHostIfNeeded(self) -> bool:
        """Download the weights if the device has trained since the last download."""
        return self._link.copy_to_host_if_needed()

    def copyNamedBuffersToDevice(self) -> None:
        """Upload only the buffers named in ``Options.updatableNamedBuffers``."""
        self._require_executable()
        names = self._options._Popart.options.get("updatableNamedBuffers")
        if not names:
            raise Error("No named buffers marked as updatable via updatableNamedBuffers option")
        self._link.copy_buffers_to_device(names)

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> Any:
        """Load into the host model, then upload if attached."""
        result = self._user_model.load_state_dict(state_dict, strict)
        if self.isAttachedToDevice():
            self.copyWeightsToDevice()
        return result

    # -- optimizer ------------------------------------------------------------------------------
    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Use ``optimizer``'s current hyper-parameters (and state, if loaded) from now on.

        Raises:
            Error: an inference model, or after compilation a constant hyper-parameter changed.
        """
        if self._optim is None:
            raise Error("setOptimizer() can only be called on a trainingModel")
        self._optim.setOptimizer(optimizer)

    # -- lifecycle ------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Drop the executable; a training model's weights are read back and it is unwrapped."""
        exe = self._executable
        if exe is None:
            return
        if self._optim is not None:
            self._link.copy_to_host_if_needed()
            self._optim.release()
        exe.close()
        self._executable = None
        self._link.disconnect()

    # -- saving ---------------------------------------------------------------------------------
    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Save the executable (and by default the model and optimizer) to ``filename``.

        A directory gets ``model.poptorch`` inside it.

        Raises:
            Error: the model has not been compiled.
        """
        exe = self._require_executable()
        self._link.copy_to_host_if_needed(implicit=True)
        optimizer = self._optim.optimizer if self._optim is not None else None
        serialization.write(
            filename,
            exe.inputs,
            self._options,
            self._training,
            self.model if export_model else None,
            optimizer if export_model else None,
            self.rng_state if save_rng_state else None,
        )

    def compileAndExport(
        self, filename: str, *args: Any, export_model: bool = True, **kwargs: Any
    ) -> None:
        """``compile(*args, **kwargs)`` then ``save(filename, export_model)``."""
        self.compile(*args, **kwargs)
        self.save(filename, export_model)

    def loadExecutable(self, filename: str) -> None:
        """Load an executable saved with ``export_model=False`` into this wrapper."""
        saved = serialization.read(filename, mismatch=Error)
        if self._executable is not None:
            self.destroy()
        args, kwargs = saved.inputs
        self.compile(*args, **kwargs)

    # -- inspection -----------------------------------------------------------------------------
    def getTensorNames(self) -> list[str]:
        """Names of the tensors that can be anchored (``Gradient___<param>``, ...)."""
        return inspection.tensor_names(self._executable, self._training)

    def getAnchoredTensor(self, short_name: str) -> torch.Tensor:
        """The latest value of the tensor anchored as ``short_name`` with ``anchorTensor``."""
        return inspection.anchored_tensor(self._executable, self._options, short_name)

    @property
    def rng_state(self) -> list[int]:
        """The random number generator's seed and state of the compiled model:
        ``[seed] + state`` (See [Note: a random stream per model]).

        Simulated: the state is torch's CPU generator state (mt19937 bytes), not PopART's
        per-tile state, and one seed draws other numbers than an IPU (see
        tests/test_footguns.py).

        Raises:
            Error: the model is not compiled.
        """
        exe = self._require_executable()
        if self._rng_pending is not None:
            return list(self._rng_pending)
        logger.debug("Reading random seed")
        logger.debug("Reading RNG state")
        return exe.rng.state()

    @rng_state.setter
    def rng_state(self, state: list[int]) -> None:
        """Set the seed and state (``[seed]`` alone reseeds); written at the next attach when
        detached, as PopTorch does."""
        self._require_executable()
        if self.isAttachedToDevice():
            self._write_rng(list(state))
        else:
            self._rng_pending = list(state)

    def _write_rng(self, state: list[int]) -> None:
        logger.debug("Setting random seed to: %d", state[0] if state else 0)
        self._require_executable().rng.set_state(state)
        if len(state) > 1:
            logger.debug("Setting RNG state")

    def cycleCount(self) -> int:
        """The IPU cycles of the last call (``opts.logCycleCount(True)``).

        Simulated: a prediction of the time model (``poptorch_sim.time_report``); PopTorch
        counts cycles only on hardware.
        """
        timing = self.__dict__.get("_time_report")
        return inspection.cycle_count(self._options, self._perf is not None, timing)

    def getPerfCounters(self) -> dict[str, list[list[float]]]:
        """Host times of the last call's events, per tensor and step (see ``perf.py``)."""
        return counters(self._perf)

    def getLatency(self) -> tuple[float, float, float]:
        """(min, max, mean) seconds from the first input requested to the last output back."""
        return inspection.latencies(self._perf)["latency"]

    def getComputeLatency(self) -> tuple[float, float, float]:
        """(min, max, mean) seconds from the last input transferred to the last output ready."""
        return inspection.latencies(self._perf)["compute"]

    def getHostIpuLatency(self) -> tuple[float, float, float]:
        """Host → IPU transfer latency: zero, inputs are views of host memory."""
        return inspection.latencies(self._perf)["host_ipu"]

    def getIpuHostLatency(self) -> tuple[float, float, float]:
        """IPU → host transfer latency: zero, outputs are host tensors."""
        return inspection.latencies(self._perf)["ipu_host"]

    def _debugGetPopartIR(self) -> str:
        """There is no PopART IR in simulation."""
        return "{}"

    # -- passthrough ----------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The wrapped model: the user's for training; for inference, PopTorch's shallow copy
        of it, so ``inference.model.eval()`` leaves the user's model (and its training
        wrapper) in training mode. See [Note: what the device copies]."""
        return self._user_model if self._training else self._model_snapshot

    @property
    def options(self) -> Options:
        """The (frozen) options of this model."""
        return self._options

    def __getstate__(self) -> dict[str, Any]:
        """What ``pickle`` / ``torch.save`` keep: the model, options and optimizer, with the
        device's latest weights and optimizer state.

        The executable (and with it the random stream), the device link and the lock are not
        kept: a loaded executor compiles on its first call and seeds its stream as a new
        model does.
        """
        if self._executable is not None:
            self._link.copy_to_host_if_needed()
        state = dict(self.__dict__)
        del state["_call_lock"], state["_link"]
        state.update(_executable=None, _perf=None, _rng_pending=None)  # _optim drops its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._call_lock = threading.RLock()
        self._link = DeviceLink(self._user_model, self._training, self, self._options)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_user_model", "_options"):
            raise AttributeError(name)
        value = getattr(self.__dict__["_user_model"], name)
        if isinstance(value, nn.Parameter):  # PopTorch's wrapper of a top-level parameter
            return GroupingHandle(self, name, value)
        return value

    def _set_replica_grouping(self, name: str, grouping: ReplicaGrouping) -> None:
        if self._executable is not None:
            raise Error(
                f"{name}.replicaGrouping() was called after the model was compiled: call it "
                "before the first call (or compile()), or destroy() the model first"
            )
        self.__dict__.setdefault("_per_replica", {})[name] = grouping

    def __repr__(self) -> str:
        return module_repr(self._user_model)


def placement(model: PoplarExecutor) -> Placement:
    """Where a compiled model runs: its stages' IPUs and the host's core split.

    Raises:
        Error: the model is not compiled.

    >>> placement(training).stage_ipus  # doctest: +SKIP
    (0, 1)
    """
    return inspection.placement_of(model._require_executable())


def allreduce_stats(model: PoplarExecutor) -> AllReduceStats | None:
    """The gradient all-reduce figures of a training model run by several processes (None for
    one process or an inference model). ``steps`` and ``seconds`` accumulate over calls.

    Raises:
        Error: the model is not compiled.

    >>> before = allreduce_stats(training).seconds  # doctest: +SKIP
    """
    return inspection.allreduce_stats_of(model._require_executable())


def compiled_batch(model: PoplarExecutor) -> int | None:
    """The batch dimension (a whole call's rows) of the first input a compiled model was
    compiled with; None where that input has no batch dimension.

    Raises:
        Error: the model is not compiled.
        AssertionError: the compiled inputs do not divide into the call's micro-batches.

    >>> compiled_batch(inference)  # doctest: +SKIP
    8
    """
    return inspection.compiled_batch_of(model._require_executable())


def staged_parts(model: PoplarExecutor) -> StagedParts | None:
    """The stages, stage executors and trainer of a compiled model cut into stages (None for
    one that runs as one program), for tools that attach to them (``memory.measure``).

    Raises:
        Error: the model is not compiled.

    >>> staged_parts(training).stages[0].ipu  # doctest: +SKIP
    0
    """
    return inspection.staged_parts_of(model._require_executable())
