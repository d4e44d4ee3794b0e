"""The simulated hardware: how many Mk2 IPUs this machine reports, and who holds which one."""

from __future__ import annotations

import fcntl
import gc
import os
import tempfile
import threading
import time
import weakref
from typing import Any

from . import env
from .errors import Error
from .logger import logger

__all__ = [
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "MK2_VERSION",
    "IpuClaim",
    "claim_ipu",
    "simulated_version",
]

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
    """The IPU version of the simulated hardware: ``POPTORCH_SIM_IPU_VERSION`` (2 = Mk2,
    21 = Bow), default 2.

    Raises:
        AssertionError: no IPUs are simulated (``POPTORCH_SIM_NUM_IPUS=0``).
        Error: ``POPTORCH_SIM_IPU_VERSION`` names a version the time model does not know.
    """
    if env.num_ipus() == 0:
        raise AssertionError("No IPU hardware available on this system")
    return simulated_version()


def simulated_version() -> int:
    """``POPTORCH_SIM_IPU_VERSION`` checked against the known versions (default 2, Mk2).

    Raises:
        Error: an unknown version.
    """
    from .timing.hardware import ipu_hardware

    version = env.ipu_version()
    return MK2_VERSION if version is None else ipu_hardware(version).version


# [Note: one model per IPU id]
# An IPU is attached to one program at a time. A model compiled with ``Options.useIpuId(n)``
# claims IPU ``n`` while it is attached (compile with ConnectionType.Always, a call, or
# attachToDevice) and gives it back on detachFromDevice, destroy, or when it is collected. A
# second claim on the same id fails with poptorch.Error, in this process or in another one
# (a POSIX record lock on a file per id, which forked children do not inherit); with
# POPTORCH_WAIT_FOR_IPU=1 a claim held by another process is waited for instead, as PopTorch
# does. Models without useIpuId take any free IPU, and there are always enough of those.

_claims: weakref.WeakValueDictionary[int, IpuClaim] = weakref.WeakValueDictionary()
_claims_lock = threading.RLock()  # a collected claim releases itself, maybe mid-claim
_WAIT_S = 0.5


class IpuClaim:
    """One model's exclusive hold on one IPU id; ``release()`` (or collection) gives it back."""

    def __init__(self, ipu_id: int, fd: int) -> None:
        self.ipu_id = ipu_id
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether the claim still holds its IPU."""
        return self._fd is not None

    def release(self) -> None:
        """Give the IPU back (idempotent)."""
        with _claims_lock:
            if self._fd is None:
                return
            if _claims.get(self.ipu_id) is self:
                del _claims[self.ipu_id]
            os.close(self._fd)  # drops the record lock
            self._fd = None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown: nothing left to release into
            pass


def _lock_path(ipu_id: int) -> str:
    folder = os.path.join(tempfile.gettempdir(), f"poptorch_sim-ipus-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"ipu{ipu_id}.lock")


def _refused(ipu_id: int, where: str) -> Error:
    return Error(
        f"Failed to acquire IPU with id {ipu_id}: it is attached to another model {where}. "
        "Call detachFromDevice() (or destroy()) on that model first, choose another id with "
        "Options.useIpuId, or set POPTORCH_WAIT_FOR_IPU=1 to wait for another process to free it."
    )


def claim_ipu(options: Any) -> IpuClaim | None:
    """Claim the IPU ``options.useIpuId`` names; None when no id was chosen or no IPU is
    simulated (``POPTORCH_SIM_NUM_IPUS=0``: PopTorch's IPU Model is a device per model).

    Raises:
        poptorch.Error: the id is held by another model of this process, or (without
            ``POPTORCH_WAIT_FOR_IPU``) by a model of another process.
    """
    if not options.exists("ipu_id") or env.num_ipus() == 0:
        return None
    ipu_id = int(options.ipu_id)
    if ipu_id in _claims:
        gc.collect()  # a model no longer referenced still holds it until collected
    with _claims_lock:
        if ipu_id in _claims:
            raise _refused(ipu_id, "in this process")
        fd = os.open(_lock_path(ipu_id), os.O_RDWR | os.O_CREAT, 0o600)
        claim = IpuClaim(ipu_id, fd)
        _claims[ipu_id] = claim  # reserved in this process while waiting for the others
    wait = env.wait_for_ipu()
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return claim
        except OSError:
            if not wait:
                claim.release()
                raise _refused(ipu_id, "in another process") from None
            logger.info("No IPU available, sleeping")
            time.sleep(_WAIT_S)
