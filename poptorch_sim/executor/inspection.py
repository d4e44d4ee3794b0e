"""What an executor tells about itself: anchored tensors, tensor names, timings, RNG state."""

from __future__ import annotations

import torch

from ..errors import NO_EXECUTABLE_ERR, Error
from .perf import counters, latency

__all__ = ["InspectionMixin"]


class InspectionMixin:
    """Read-outs of ``PoplarExecutor``: ``getTensorNames``, ``getAnchoredTensor``, timings."""

    def getTensorNames(self) -> list[str]:
        """Names of the tensors that can be anchored (``Gradient___<param>``, ...)."""
        exe = self._executable  # type: ignore[attr-defined]
        if exe is None:
            raise AssertionError("Model must be compiled before calling getTensorNames")
        names = []
        for name, _, _ in exe.device.pairs:
            names.append(name)
            if self._training:  # type: ignore[attr-defined]
                names += [f"Gradient___{name}", f"UpdatedVar___{name}"]
        return names

    def getAnchoredTensor(self, short_name: str) -> torch.Tensor:
        """The latest value of the tensor anchored as ``short_name`` with ``anchorTensor``."""
        anchored = self._options.anchored_tensors  # type: ignore[attr-defined]
        exe = self._executable  # type: ignore[attr-defined]
        if short_name not in anchored or exe is None or exe.trainer is None:
            raise AssertionError(f"No tensor with name {short_name} found.")
        long_name = anchored[short_name][0]
        if long_name not in exe.trainer.anchors:
            raise AssertionError(f"No tensor with name {short_name} found.")
        return exe.trainer.anchors[long_name]

    @property
    def rng_state(self) -> list[int]:
        """``[seed] + state`` of the device RNG."""
        if self._executable is None:  # type: ignore[attr-defined]
            raise Error(NO_EXECUTABLE_ERR)
        return [torch.initial_seed()] + torch.get_rng_state().tolist()

    @rng_state.setter
    def rng_state(self, state: list[int]) -> None:
        if self._executable is None:  # type: ignore[attr-defined]
            raise Error(NO_EXECUTABLE_ERR)
        torch.set_rng_state(torch.tensor(state[1:], dtype=torch.uint8))

    def cycleCount(self) -> int:
        """Cycle counts exist only on hardware; the simulator counts none."""
        if not self._options._Popart.options.get("instrumentWithHardwareCycleCounter"):  # type: ignore[attr-defined]
            raise Error(
                "Cycle count logging is disabled. Please set option logCycleCount to True to "
                "enable."
            )
        if not self._last_run:  # type: ignore[attr-defined]
            raise Error("Please run the model at least once before obtaining cycle count.")
        raise Error("Cycle count logging is only supported on actual IPU hardware.")

    def getPerfCounters(self) -> dict[str, list[list[float]]]:
        """Host times of the last call's events, per tensor and step (see ``perf.py``)."""
        return counters(self._perf)  # type: ignore[attr-defined]

    def getLatency(self) -> tuple[float, float, float]:
        """(min, max, mean) seconds from the first input requested to the last output back."""
        return latency(self.getPerfCounters(), "input", min, "output_complete", max)

    def getComputeLatency(self) -> tuple[float, float, float]:
        """(min, max, mean) seconds from the last input transferred to the last output ready."""
        return latency(self.getPerfCounters(), "input_complete", max, "output", max)

    def getHostIpuLatency(self) -> tuple[float, float, float]:
        """Host → IPU transfer latency: zero, inputs are views of host memory."""
        return latency(self.getPerfCounters(), "input", min, "input_complete", max)

    def getIpuHostLatency(self) -> tuple[float, float, float]:
        """IPU → host transfer latency: zero, outputs are host tensors."""
        return latency(self.getPerfCounters(), "output", min, "output_complete", max)

    def _debugGetPopartIR(self) -> str:
        """There is no PopART IR in simulation."""
        return "{}"
