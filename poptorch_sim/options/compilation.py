"""The compilation, profiling and logging setters of ``poptorch.Options``."""

from __future__ import annotations

from typing import Self

import torch

from .. import env
from ._dict import OptionsDict, no_effect
from .groups import _PopartOptions

__all__ = ["CompilationSetters"]


class CompilationSetters(OptionsDict):
    """``Options``' setters of compilation, profiling, logs and the seed (part of
    ``poptorch.Options``; its options are declared there)."""

    _popart: _PopartOptions
    _profile_dir: str | None
    _module_namescope_enabled: bool
    _show_compilation_progress_bar: bool
    _relax_optimizer_attributes_checks: bool
    _source_location_excludes: list[str]

    def enableExecutableCaching(self, path: str | None) -> Self:
        """Cache compiled executables in ``path`` (``None`` disables); compiling is instant here."""
        no_effect("enableExecutableCaching")
        if path is None:
            self._popart.set("enableEngineCaching", False)
        else:
            self._popart.set("enableEngineCaching", True)
            self._popart.set("cachePath", path)
        return self

    def enableSyntheticData(self, enabled: bool) -> Self:
        """Run on data generated on the device instead of the host's (benchmarking perfect IO).

        As in PopTorch, any true value selects ``popart.SyntheticDataMode.RandomNormal`` (2);
        ``opts._Popart.set("syntheticDataMode", mode)`` picks another mode (1 ``Zeros``,
        3 ``RandomUniform``).

        Simulated: each call's input tensors are replaced by tensors of their shape and dtype
        (floating point: zeros, N(0, 1) or U(0, 1); integer and bool: zeros, so labels stay
        valid); outputs are returned as computed, where an IPU would not copy them back.
        See ``poptorch_sim.executor.synthetic``.

        Args:
            enabled: True (or a non-zero ``SyntheticDataMode``) for RandomNormal, False for
                the host's data.

        >>> opts = Options().enableSyntheticData(True)
        """
        self._popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    def enableStableNorm(self, enabled: bool) -> Self:
        """Numerically stable norm statistics (stored; PyTorch's norms are already stable)."""
        self._popart.set("enableStableNorm", enabled)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> Self:
        """Log the device cycle count (only real hardware counts cycles)."""
        self._popart.set("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def enableProfiling(self, profile_dir: str | None = None) -> Self:
        """Write an execution trace (Chrome trace JSON, opens in Perfetto) and the memory report
        to ``profile_dir``; as PopTorch, also sets ``debug.allowOutOfMemory``."""
        self._profile_dir = profile_dir or "."
        self._popart.set(
            "engineOptions",
            {
                "autoReport.all": "true",
                "autoReport.directory": self._profile_dir,
                "debug.allowOutOfMemory": "true",  # as PopTorch: profile what does not fit
            },
        )
        return self

    def modelName(self, name: str) -> Self:
        """Name of the model (used in reports)."""
        self.createOrSet(model_name=name)
        return self

    def logDir(self, log_dir: str) -> Self:
        """Where logs and reports go."""
        self.set(log_dir=log_dir)
        return self

    def maxRepeatLogs(self, max_lines: int | None) -> Self:
        """How many times one log message may repeat (``None``: unlimited)."""
        self.set(max_repeat_logs=(1 << 63) - 1 if max_lines is None else max_lines)
        return self

    def disableModuleNamescope(self) -> Self:
        """Name ops without their module scope (stored)."""
        self._module_namescope_enabled = False
        return self

    def updatableNamedBuffers(self, buffers: list[str]) -> Self:
        """Buffers that ``copyNamedBuffersToDevice()`` uploads."""
        self._popart.set("updatableNamedBuffers", list(buffers))
        return self

    def showCompilationProgressBar(self, show: bool = True) -> Self:
        """Show the "Graph compilation" progress bar (needed for ``compilationTime()``)."""
        self._show_compilation_progress_bar = show
        return self

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> Self:
        """Report unexpected optimizer attributes at debug level instead of as warnings."""
        self._relax_optimizer_attributes_checks = relax
        return self

    def sourceLocationExcludes(self, excludes: list[str]) -> Self:
        """Paths ignored when attributing ops to source lines."""
        self._source_location_excludes = list(excludes)
        return self

    def appendToLocationExcludes(self, *excludes: str) -> Self:
        """Add paths ignored when attributing ops to source lines."""
        self._source_location_excludes.extend(excludes)
        return self

    def randomSeed(self, random_seed: int) -> Self:
        """Seed the device RNG; also seeds torch now, as PopTorch does."""
        if not isinstance(random_seed, int):
            raise AssertionError(f"random_seed must be an int, got {random_seed!r}")
        torch.manual_seed(random_seed)
        self.createOrSet(random_seed=random_seed)
        return self

    @property
    def profile_dir(self) -> str | None:
        """Where the execution trace goes: ``enableProfiling`` or ``POPLAR_ENGINE_OPTIONS``."""
        if self._profile_dir is not None:
            return self._profile_dir
        engine = env.engine_options()
        return engine.get("autoReport.directory") if engine else None
