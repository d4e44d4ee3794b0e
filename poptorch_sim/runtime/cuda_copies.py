"""The host ↔ device copies of overlapped IO: plain copies on the CPU; pinned memory and side
streams, ordered with the compute stream by events, on CUDA.

A load copies a host tensor into a new device buffer (float64 → float32, as the host does for an
IPU); a store copies a device tensor into a new host tensor with the IPU's int64 → int32 /
float64 → float32 demotion. On CUDA one micro-batch's copies go::

    load stream     pinned host ──copy──► device buffer ─┐ event "loaded"
    compute stream                         wait "loaded" ─┴─► program ─┐ event "computed"
    store stream                           wait "computed" ────────────┴─► pinned host ─► sync
"""

from __future__ import annotations

from typing import Any

import torch

from .dtypes import device_dtype, host_dtype

__all__ = ["Copies"]


class Copies:
    """The copies of one IPU's IO tiles to and from ``device``.

    Args:
        device: where the program computes.

    >>> copies = Copies(torch.device("cpu"))
    >>> copies.load(torch.ones(2, dtype=torch.float64)).dtype
    torch.float32
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.load_stream = torch.cuda.Stream(device)
            self.store_stream = torch.cuda.Stream(device)

    def load(self, host: torch.Tensor) -> torch.Tensor:
        """A new device buffer holding ``host`` in the device's dtype."""
        target = device_dtype(host.dtype)
        host = host.detach()
        if not self.cuda:
            return torch.empty(host.shape, dtype=target, device=self.device).copy_(host)
        pinned = torch.empty(host.shape, dtype=host.dtype, pin_memory=True).copy_(host)
        with torch.cuda.stream(self.load_stream):
            buffer = torch.empty(host.shape, dtype=target, device=self.device)
            buffer.copy_(pinned, non_blocking=True)
        buffer.record_stream(torch.cuda.default_stream(self.device))  # computed on there
        return buffer

    def before_compute(self) -> None:
        """Make the compute stream wait for the loads issued so far."""
        if self.cuda:
            loaded = torch.cuda.Event()
            loaded.record(self.load_stream)
            torch.cuda.current_stream(self.device).wait_event(loaded)

    def after_compute(self, events: list[Any]) -> None:
        """Append to ``events`` the point the micro-batch's stores must wait for."""
        if self.cuda:
            computed = torch.cuda.Event()
            computed.record(torch.cuda.current_stream(self.device))
            events.append(computed)

    def store(self, value: torch.Tensor, events: list[Any]) -> torch.Tensor:
        """A new host tensor for ``value`` (on CUDA: still landing until ``finish_store``)."""
        target = host_dtype(value.dtype)
        value = value.detach()
        if not (self.cuda and value.is_cuda):
            return torch.empty(value.shape, dtype=target).copy_(value)
        host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        with torch.cuda.stream(self.store_stream):
            for event in events:
                self.store_stream.wait_event(event)
            value.record_stream(self.store_stream)
            host.copy_(value, non_blocking=True)
        return host  # converted in finish_store, once the copy landed

    def finish_store(self, values: list[Any]) -> list[Any]:
        """The stored ``values`` once landed, in the host's dtypes."""
        if not self.cuda:
            return values
        self.store_stream.synchronize()
        return [v.to(host_dtype(v.dtype)) if isinstance(v, torch.Tensor) else v for v in values]
