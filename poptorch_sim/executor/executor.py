"""``PoplarExecutor``: what ``trainingModel`` and ``inferenceModel`` return.

It joins the compiler and the runtime: it owns the lifecycle (compile, attach/detach, destroy,
save/load), the host ↔ device weights (see [Note: lazy weight sync] in weights.py), the
optimizer snapshot, and the shape of each call's outputs.
"""

from __future__ import annotations

import datetime
import itertools
import os
import threading
import time
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .. import env
from ..compiler import TraceFailure
from ..compiler.overlap import check_overlapped_io, num_io_tiles
from ..compiler.sharding import sharding_of
from ..compiler.verify import check_max_ipus
from ..distributed import synchronize_weights
from ..enums import ConnectionType, OutputMode
from ..errors import NO_EXECUTABLE_ERR, Error
from ..hardware import IpuClaim, claim_ipu, ipuHardwareIsAvailable
from ..logger import logger, warning_once
from ..memory.build import at_compile as memory_at_compile
from ..ops.annotations import overlap_marks
from ..ops.blocks import uses_begin_block
from ..ops.group_norm import stride_group_norms
from ..optim import SGD
from ..optim.snapshot import OptimizerSnapshot
from ..options import Options
from ..options.session import log_options
from ..printing import module_repr
from ..profiling.trace import TraceRecorder
from ..runtime.dtypes import device_dtype
from ..runtime.intra_op import resolve_threads_per_ipu
from ..runtime.io_tiles import IoTiles
from . import hooks
from .batching import Layout, check_batch
from .device_tree import shallow_copy
from .eager import EagerProgram
from .inputs import ArgsParser, BoundArgs, validate_inputs
from .inspection import InspectionMixin
from .outputs import OutputCollector
from .perf import PerfRecord
from .progress import CompilationBar
from .replicas import ReplicaBuffers
from .serialization import SerializationMixin
from .staged import StagedRunner
from .synthetic import synthetic_data
from .training import DeviceTrainer, OptimizerMixin
from .weights import DeviceCopy, HostSync, owner_of

# PopTorch's wording.
_DETACHED_INPUT = (
    "Input tensor has requires_grad=True set. This tensor will be detached because backward "
    "pass via inputs is not supported."
)

# Simulated: a model with blocks that neither torch.fx nor torch.export can capture still runs,
# as one program.
_EAGER_FALLBACK = (
    "poptorch_sim falls back to running this model as one program on a single simulated IPU, "
    "one micro-batch at a time: outputs, gradients and weights are the same as PopTorch's and "
    "eager PyTorch's, but its blocks do not run on separate IPU threads (no pipelining or "
    "sharding), and the pipeline checks (depth, IPU count) are not applied."
)

__all__ = ["PoplarExecutor"]

_io_serial = itertools.count()  # names the overlapped-IO trace files of a process


class PoplarExecutor(InspectionMixin, SerializationMixin, OptimizerMixin):
    """A model wrapped for a simulated IPU. Never constructed directly: use
    ``poptorch.trainingModel`` or ``poptorch.inferenceModel``.
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
        self._options = _resolve_options(options, training)
        self._training = training
        self._optimizer = optimizer
        self._parser = ArgsParser(model)
        self._synthetic = synthetic_data(
            self._options._popart.options, getattr(self._options, "random_seed", None)
        )
        self._executable: _Executable | None = None
        self._is_attached = False
        self._ipu_claim: IpuClaim | None = None  # See [Note: one model per IPU id]
        self._dirty_host_weights = False
        self._host_weights_version = 0
        self._linked_version = -1
        self._last_run: dict[str, float] = {}
        self._perf: PerfRecord | None = None
        self._seed_pending = False  # randomSeed: seed the device RNG at the next attach
        self._call_lock = threading.RLock()  # See [Note: calls from several threads]
        self._host_sync = HostSync(model, self) if training else None
        self._snapshot: OptimizerSnapshot | None = None
        if training:
            if optimizer is None:
                optimizer = SGD(model.parameters(), lr=0.01)
            self._optimizer = optimizer
            self._snapshot = self._take_snapshot(optimizer)
            self._host_sync.wrap()  # type: ignore[union-attr]

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
            if not self._is_attached:
                self.attachToDevice()
            if not self._training:
                self._follow_training_weights()
            exe = self._executable
            assert exe is not None
            if exe.io is None:
                return self._run(exe, bound)
        return self._run(exe, bound)

    def _run(self, exe: _Executable, bound: BoundArgs) -> Any:
        check_batch(bound, exe.layout)
        opts = self._options
        collector = OutputCollector(
            OutputMode(opts.output_mode), opts.output_return_period, exe.layout
        )
        trainer = exe.trainer
        if trainer is not None and getattr(self._optimizer, "ipu_state_is_dirty", False):
            self._connect_optimizer_state()  # a loaded state is written before the run uses it
        self._last_run["input"] = time.perf_counter()
        if exe.io is not None:
            if any(t.requires_grad for t in bound.tensors()):
                warning_once(_DETACHED_INPUT)
            lay = exe.layout
            micro = [
                mb for d in range(lay.device_iterations) for mb in lay.step_micro_batches(bound, d)
            ]
            for leaves in exe.io.run(micro):  # the IO threads convert dtypes as they load
                collector.add(leaves)
        else:
            exe.program.run(
                bound.map_tensors(_to_device_dtype),
                exe.layout,
                collector,
                trainer.loss_scaling if trainer else 1.0,
                trainer.step if trainer else None,
            )
        if trainer is not None:
            trainer.finish_run()
        self._last_run["output_complete"] = time.perf_counter()
        self._perf = PerfRecord(
            start=self._last_run["input"],
            collected=tuple(collector.times),
            num_inputs=sum(1 for _ in bound.tensors()),
            num_outputs=collector.num_outputs,
            mode=OutputMode(opts.output_mode).name,
            period=opts.output_return_period,
            gradient_accumulation=exe.layout.gradient_accumulation,
            replicas=exe.layout.replicas,
            synthetic=bool(opts._Popart.options.get("syntheticDataMode", 0)),
        )
        if trainer is not None:
            self._dirty_host_weights = True
            # The user's optimizer never steps on the host; LR schedulers must not warn.
            self._optimizer._opt_called = True  # type: ignore[union-attr]
            if hasattr(self._optimizer, "host_state_is_dirty"):
                self._optimizer.host_state_is_dirty = True
        leaves = collector.result()
        spec = exe.program.out_spec
        return None if spec is None else pytree.tree_unflatten(leaves, spec)

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
        if self._host_sync is not None:
            self._host_sync.wrap()
        layout = _layout(self._options, self._training)
        check_batch(bound, layout)
        overlap_marks()  # forget marks left by eager runs of forward
        bar.update(10)
        # An offline executable never runs: PopTorch compiles it in each process without its
        # peers, so no process group is joined (loading it compiles again, online).
        if self._training and self._options.connection_type != ConnectionType.Never:
            synchronize_weights(self._user_model, self._options)
        device = DeviceCopy(self._model_snapshot)
        if self._options._Popart.options.get("groupNormStridedChannelGrouping"):
            stride_group_norms(device.model)
        _check_updatable_buffers(self._options, device.model)
        if (
            self._options._Popart.options.get("instrumentWithHardwareCycleCounter")
            and not ipuHardwareIsAvailable()
        ):
            raise Error("Cycle count logging is only supported on actual IPU hardware.")
        program = self._build_program(device, bound, layout)
        _acquire(
            program.program.meta["num_ipus"]
            if isinstance(program, StagedRunner)
            else layout.replicas
        )
        held = self._ipu_claim is not None and self._ipu_claim.held
        if self._options.connection_type == ConnectionType.Always and not held:
            self._ipu_claim = claim_ipu(self._options)  # before the executable, as PopTorch
        marked, overlapped = overlap_marks()
        bar.update(80)
        trainer = self._build_trainer(device, layout) if self._training else None
        if trainer is not None and isinstance(program, StagedRunner):
            trainer.trace = program.trace
            program.stage_step = trainer.stage_steps(program.program)
        first = layout.micro_batch(bound.map_tensors(_to_device_dtype), 0, 0, 0)
        try:
            self._memory_report = memory_at_compile(
                program, trainer, self._options, first, self._training
            )
        except BaseException:
            if isinstance(program, StagedRunner):
                program.close()
            raise
        io = None
        if overlapped or (marked and num_io_tiles(self._options) > 0):
            io = self._io_tiles(program, overlapped)
        self._executable = _Executable(bound, layout, device, program, trainer, io)
        self._seed_pending = self._options.exists("random_seed")
        self._connect_optimizer_state()
        hooks.run_post_compile()
        bar.finish()
        self._compilation_time = datetime.datetime.now() - start
        if self._options.connection_type == ConnectionType.Always:
            self._attach()

    def _build_program(
        self, device: DeviceCopy, bound: BoundArgs, layout: Layout
    ) -> EagerProgram | StagedRunner:
        first = layout.micro_batch(bound.map_tensors(_to_device_dtype), 0, 0, 0)
        eager = None
        if not uses_begin_block(device.model) and sharding_of(device.model, self._options) is None:
            eager = self._eager_program(device, first, layout)
            if not eager.blocks_seen:
                return eager
        try:
            return StagedRunner(device.model, self._options, first, self._training)
        except TraceFailure as failure:
            logger.warning("%s\n%s", failure, _EAGER_FALLBACK)
            return eager or self._eager_program(device, first, layout)

    def _io_tiles(self, program: EagerProgram | StagedRunner, overlap: bool) -> IoTiles | None:
        """PopTorch's overlapped-IO checks, then the IO threads of an inference program: a
        load / compute / store pipeline, or (all marks ``NoOverlap``) the same copies just in
        time.

        Simulated: a training model with overlapped IO runs without IO threads (see
        tests/test_footguns.py).
        """
        options = self._options
        if overlap:
            check_overlapped_io(options)
        if self._training:
            return None
        report = None
        if isinstance(program, StagedRunner):
            trace = program.trace
        else:
            trace = TraceRecorder() if options.profile_dir else None
            if options.profile_dir:
                name = f"overlap_io_trace_{next(_io_serial)}.json"
                report = os.path.join(options.profile_dir, name)
        return IoTiles(
            program.run_micro_batch,
            lambda mb, fn: mb.map_tensors(fn),
            program.input_device,
            num_io_tiles(options),
            resolve_threads_per_ipu(None, 1),
            depth=int(options._Popart.options.get("defaultPrefetchBufferingDepth", 1)),
            trace=trace,
            report=report,
            overlap=overlap,
        )

    def _eager_program(self, device: DeviceCopy, first: BoundArgs, layout: Layout) -> EagerProgram:
        replicated = layout.replicas > 1
        broadcast = self._options.broadcast_buffers
        buffers = (
            ReplicaBuffers(device.model, layout.replicas) if replicated and not broadcast else None
        )
        program = EagerProgram(device.model, self._training, buffers, replicated and broadcast)
        program.prepare(first, device.check_unchanged)
        checks = self._options._Popart.options.get("enableFloatingPointChecks", False)
        program.fp_checks = bool(checks)
        program.use_replica_threads(layout.replicas)
        return program

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
    def _require_executable(self) -> _Executable:
        if self._executable is None:
            raise Error(NO_EXECUTABLE_ERR)
        return self._executable

    def _attach(self) -> None:
        if self._ipu_claim is None or not self._ipu_claim.held:
            self._ipu_claim = claim_ipu(self._options)
        self._is_attached = True
        self.copyWeightsToDevice()
        if self._seed_pending:
            # PopTorch seeds the device RNG when it loads an executable; the device RNG here
            # is torch's, so two models with one randomSeed draw the same numbers.
            self._seed_pending = False
            seed = self._options.random_seed
            logger.debug("Setting random seed to: %d", seed)
            torch.manual_seed(seed)
        if getattr(self._optimizer, "ipu_state_is_dirty", False):
            self._connect_optimizer_state()  # a state loaded while detached goes up now

    def attachToDevice(self) -> None:
        """Attach again and upload the host weights (and optimizer state)."""
        self._require_executable()
        if self._is_attached:
            raise Error("Device is already attached")
        if self._options.connection_type == ConnectionType.Never:
            raise AssertionError("Trying to attach to an offline device (ConnectionType.Never)")
        self._attach()

    def detachFromDevice(self) -> None:
        """Read weights (training) back to the host and release the device."""
        self._require_executable()
        if not self._is_attached:
            raise Error("Device is not attached")
        if self._training:
            self.copyWeightsToHostIfNeeded()
        self._is_attached = False
        if self._ipu_claim is not None:
            self._ipu_claim.release()

    def isAttachedToDevice(self) -> bool:
        """Whether the device is attached (False when not compiled)."""
        return self._executable is not None and self._is_attached

    # -- weights --------------------------------------------------------------------------------
    def copyWeightsToDevice(self) -> None:
        """Upload the host model's weights and buffers, discarding the device's own values."""
        exe = self._require_executable()
        owner = owner_of(self._user_model)
        if owner is not None and owner is not self:
            owner.copyWeightsToHostIfNeeded()
        self._dirty_host_weights = False
        logger.debug("Writing weights from host to IPU memory.")
        exe.device.upload()
        if exe.program.buffers is not None:
            exe.program.buffers.broadcast_from_first()
        if owner is not None and owner is not self:
            self._linked_version = owner._host_weights_version

    def copyWeightsToHost(self) -> None:
        """Download the device's weights and buffers into the host model."""
        exe = self._require_executable()
        logger.debug("Writing weights from IPU to host.")
        exe.device.download()
        self._dirty_host_weights = False
        self._host_weights_version += 1

    def copyWeightsToHostIfNeeded(self) -> bool:
        """Download the weights if the device has trained since the last download."""
        if self._training and self._dirty_host_weights and self._executable is not None:
            self.copyWeightsToHost()
            return True
        return False

    def _implicit_copy_to_host(self) -> None:
        logger.debug("Implicit copyWeightsToHost()")
        self.copyWeightsToHost()

    def copyNamedBuffersToDevice(self) -> None:
        """Upload only the buffers named in ``Options.updatableNamedBuffers``."""
        exe = self._require_executable()
        names = self._options._Popart.options.get("updatableNamedBuffers")
        if not names:
            raise Error("No named buffers marked as updatable via updatableNamedBuffers option")
        exe.device.upload(only=lambda n: n in names)

    def _follow_training_weights(self) -> None:
        owner = owner_of(self._user_model)
        if owner is None or owner is self:
            return
        owner.copyWeightsToHostIfNeeded()
        if owner._host_weights_version != self._linked_version:
            self.copyWeightsToDevice()

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> Any:
        """Load into the host model, then upload if attached."""
        result = self._user_model.load_state_dict(state_dict, strict)
        if self.isAttachedToDevice():
            self.copyWeightsToDevice()
        return result

    # -- lifecycle ------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Drop the executable; a training model's weights are read back and it is unwrapped."""
        if self._executable is None:
            return
        if self._training:
            self.copyWeightsToHostIfNeeded()
            if hasattr(self._optimizer, "_set_state_reader"):
                self._optimizer.state_dict()
                self._optimizer._set_state_reader(None)
        if self._executable.io is not None:
            self._executable.io.close()
        self._executable.program.close()
        self._executable = None
        self._is_attached = False
        if self._ipu_claim is not None:
            self._ipu_claim.release()
        if self._host_sync is not None:
            self._host_sync.unwrap()

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
        """What ``pickle`` / ``torch.save`` keep: the model, options and optimizer.

        The executable and the lock are not kept: a loaded executor compiles on its first call
        (PopTorch pickles its wrapper the same way, without a compiled executable).
        """
        state = dict(self.__dict__)
        del state["_call_lock"]
        state.update(
            _executable=None, _is_attached=False, _linked_version=-1, _last_run={}, _perf=None
        )
        state["_ipu_claim"] = None  # a loaded executor claims its IPU when it attaches
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._call_lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_user_model", "_options"):
            raise AttributeError(name)
        return getattr(self.__dict__["_user_model"], name)

    def __repr__(self) -> str:
        return module_repr(self._user_model)


class _Executable:
    """What compilation produced."""

    def __init__(
        self,
        inputs: BoundArgs,
        layout: Layout,
        device: DeviceCopy,
        program: EagerProgram | StagedRunner,
        trainer: DeviceTrainer | None,
        io: IoTiles | None = None,
    ) -> None:
        self.inputs = inputs
        self.layout = layout
        self.device = device
        self.program = program
        self.trainer = trainer
        self.io = io  # overlapped IO's threads (inference with IO tiles), else None


def _acquire(needed: int) -> None:
    """Raise PopTorch's error if the model needs more IPUs than the machine simulates.

    With ``POPTORCH_SIM_NUM_IPUS=0`` (no hardware) models run as on PopTorch's IPU Model, which
    has no such limit.
    """
    check_max_ipus(needed)  # PopTorch's per-process limit comes before the machine's size
    available = env.num_ipus()
    if 0 < available < needed:
        raise Error(
            f"Failed to acquire {needed} IPU(s): this machine simulates {available} "
            f"(POPTORCH_SIM_NUM_IPUS={available}). Set POPTORCH_SIM_NUM_IPUS={needed} or more, "
            "or use fewer replicas or IPUs."
        )


def _resolve_options(options: Options | None, training: bool) -> Options:
    if options is None:
        options = Options()
    if not isinstance(options, Options):
        raise Error(
            f"Invalid type: 'options' is of type {type(options)} (Expected poptorch.Options)"
        )
    options._freeze()
    resolved = options.clone()
    if resolved.defaultOutputMode():
        resolved.outputMode(OutputMode.Final if training else OutputMode.All)
    resolved._freeze()
    return resolved


def _layout(options: Options, training: bool) -> Layout:
    return Layout(
        options.device_iterations,
        options.Training.gradient_accumulation if training else 1,
        options.replication_factor,
        options.input_group_size,
        options.input_cgt,
    )


def _to_device_dtype(t: torch.Tensor) -> torch.Tensor:
    if t.requires_grad:
        warning_once(_DETACHED_INPUT)
        t = t.detach()
    return t.to(device_dtype(t.dtype))


def _check_updatable_buffers(options: Options, model: nn.Module) -> None:
    wanted = options._Popart.options.get("updatableNamedBuffers", [])
    known = [name for name, _ in model.named_buffers()]
    for name in wanted:
        if name not in known:
            raise Error(
                f"Invalid updatable buffer {name}: the model has no buffer of that name "
                f"(its buffers: {', '.join(known) or 'none'}). Fix the names given to "
                "Options.updatableNamedBuffers."
            )
