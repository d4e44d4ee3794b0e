"""PopTorch's compile-time rules for overlapped IO (``set_overlap_for_input/output``).

PopTorch checks them when the model is compiled, once any input or output was marked with an
``OverlapMode`` other than ``NoOverlap``, in this order (its ``verifySettingsForOverlappedIO``):

    1. the execution strategy is PipelinedExecution (the default, even for one IPU)
    2. no IO tiles: ``Options.TensorLocations.numIOTiles`` was never set
    3. the output mode is neither ``All`` nor ``Sum``
"""

from __future__ import annotations

from typing import Any

from ..enums import OutputMode
from ..errors import Error

__all__ = ["check_overlapped_io", "num_io_tiles"]

# PopTorch's wording, each.
PIPELINED_ERROR = (
    "Overlapped IO is not supported with poptorch.PipelinedExecution. If you are using only one "
    "IPU, please switch to poptorch.ShardedExecution."
)
NO_IO_TILES_ERROR = (
    "No IO tiles allocated. You must allocate at least 32 IO tiles using "
    "poptorch.Options().TensorLocations.numIOTiles."
)
OUTPUT_MODE_ERROR = (
    "Unsupported output mode for overlapped IO. Please switch output mode to "
    "poptorch.OutputMode.All or poptorch.OutputMode.Sum."
)


def num_io_tiles(options: Any) -> int:
    """The ``numIOTiles`` the options ask for (0 when never set)."""
    return int(options.TensorLocations._values.get("numIOTiles", 0))


def check_overlapped_io(options: Any) -> None:
    """Raise PopTorch's first overlapped-IO error that ``options`` (already resolved) trigger.

    Args:
        options: the model's resolved ``poptorch.Options`` (its output mode no longer Default).

    Raises:
        poptorch.Error: PipelinedExecution, no IO tiles, or an output mode other than All/Sum,
            checked in that order.
    """
    strategy = getattr(options, "_execution_strategy", None)
    if getattr(strategy, "mode", None) == "pipelined":
        raise Error(PIPELINED_ERROR)
    if num_io_tiles(options) == 0:
        raise Error(NO_IO_TILES_ERROR)
    if OutputMode(options.output_mode) not in (OutputMode.All, OutputMode.Sum):
        raise Error(OUTPUT_MODE_ERROR)
