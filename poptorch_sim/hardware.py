"""The simulated hardware: how many Mk2 IPUs this machine reports."""

from __future__ import annotations

from . import env

__all__ = ["ipuHardwareIsAvailable", "ipuHardwareVersion", "MK2_VERSION"]

MK2_VERSION = 2


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """Whether ``num_ipus`` simulated IPUs are available.

    Simulated: the machine reports ``POPTORCH_SIM_NUM_IPUS`` Mk2 IPUs (default 64), so libraries
    that probe for hardware (Lightning, optimum-graphcore) take their IPU paths. Set it to 0 to
    report none, as PopTorch's own tests expect on a machine without IPUs.

    >>> ipuHardwareIsAvailable(4)
    True
    """
    return 0 < num_ipus <= env.num_ipus()


def ipuHardwareVersion() -> int:
    """The IPU version of the simulated hardware: 2 (Mk2).

    Raises:
        AssertionError: no IPUs are simulated (``POPTORCH_SIM_NUM_IPUS=0``).
    """
    if env.num_ipus() == 0:
        raise AssertionError("No IPU hardware available on this system")
    return MK2_VERSION
