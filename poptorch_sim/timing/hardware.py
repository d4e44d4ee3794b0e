"""The IPUs the time model knows: one table of constants per IPU version, each with its source.

Versions are numbered as PopTorch numbers them (``useOfflineIpuTarget(ipu_version)``):
2 = Mk2 (GC200: IPU-M2000, IPU-POD16/64), 21 = Bow (Bow-2000, Bow Pod16/64).

=====================  ==========  ==========  ==================================================
quantity               Mk2         Bow         source
=====================  ==========  ==========  ==================================================
tiles                  1472        1472        PopTorch ``popart_compiler/source/Utils.cpp``
clock                  1.325 GHz   1.850 GHz   derived: datasheet peak / (1472 × 128 flop/cycle);
                                               Graphcore's MLPerf Training system files give
                                               1.33 and 1.85 GHz (accelerator_frequency)
FP16 flop/cycle/tile   128         128         64 FP16 MAC (AMP): IPU-POD64 / Bow Pod256 sheets
FP32 flop/cycle/tile   32          32          16 FP32 MAC: the same datasheets
on-tile memory         24 B/cycle  24 B/cycle  47.5 TB/s per Mk2 IPU (product page); Bow: not
                       per tile    per tile    published, taken to scale with the clock
exchange               4.1 B/cycle same        8 TB/s per Mk2 IPU, any pattern (product page)
                       per tile
IPU-Links              32 GB/s     32 GB/s     320 GB/s per chip over 10 links (product page)
                       per link    per link
gateway links          12.5 GB/s   12.5 GB/s   100 GbE RoCE per machine (IPU-M2000 datasheet):
                                               the all-reduce's hop between IPU-PODs16
host (PCIe)            64 GB/s     64 GB/s     PCIe Gen4 ×16 at the chip (datasheet)
streaming memory       16 GB/s     16 GB/s     not published: the gateway-to-IPU hop, PCIe
                                               Gen4 ×8 per direction (M2000 block diagram,
                                               unverified)
=====================  ==========  ==========  ==================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import Error

__all__ = ["BOW", "IPU_VERSIONS", "MK2", "IpuHardware", "ipu_hardware"]


@dataclass(frozen=True)
class IpuHardware:
    """The constants of one IPU version (see the module table)."""

    version: int
    name: str
    tiles: int
    clock_hz: float
    fp16_flops_per_cycle: int  # per tile
    fp32_flops_per_cycle: int  # per tile
    memory_bytes_per_cycle: float  # per tile, on-tile SRAM
    exchange_bytes_per_cycle: float  # per tile, tile to tile
    link_bytes_per_s: float  # one IPU-Link
    gateway_bytes_per_s: float  # between IPU-PODs16 (IPU over fabric)
    host_bytes_per_s: float  # PCIe to the chip
    streaming_bytes_per_s: float  # off-chip streaming memory to the chip

    def peak_flops(self, dtype: str = "float16") -> float:
        """FLOP/s of the whole chip at ``dtype`` (the datasheet's peak)."""
        return self.tiles * self.flops_per_cycle(dtype) * self.clock_hz

    def flops_per_cycle(self, dtype: str) -> int:
        """FLOPs per cycle per tile at ``dtype`` (FP16 on the AMP; anything else at FP32)."""
        return self.fp16_flops_per_cycle if dtype in _HALF else self.fp32_flops_per_cycle


_HALF = ("float16", "bfloat16", "half")

MK2 = IpuHardware(
    version=2,
    name="Mk2 (GC200)",
    tiles=1472,
    clock_hz=1.325e9,
    fp16_flops_per_cycle=128,
    fp32_flops_per_cycle=32,
    memory_bytes_per_cycle=47.5e12 / 1472 / 1.325e9,
    exchange_bytes_per_cycle=8e12 / 1472 / 1.325e9,
    link_bytes_per_s=32e9,
    gateway_bytes_per_s=12.5e9,
    host_bytes_per_s=64e9,
    streaming_bytes_per_s=16e9,
)

# The same chip at a higher clock: every per-cycle figure is Mk2's (see the module table).
BOW = replace(MK2, version=21, name="Bow", clock_hz=1.85e9)

IPU_VERSIONS = {hw.version: hw for hw in (MK2, BOW)}


def ipu_hardware(version: int) -> IpuHardware:
    """The constants of IPU ``version`` (2 or 21).

    Raises:
        Error: an IPU version the time model does not know.
    """
    try:
        return IPU_VERSIONS[int(version)]
    except (KeyError, TypeError, ValueError):
        known = ", ".join(f"{v} ({hw.name})" for v, hw in IPU_VERSIONS.items())
        raise Error(
            f"unknown IPU version {version!r} (known: {known}): pass one of them to "
            "Options.useOfflineIpuTarget(ipu_version) or POPTORCH_SIM_IPU_VERSION"
        ) from None
