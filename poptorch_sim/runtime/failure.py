"""What a worker reports when a stage fails, and the message the caller raises from it.

Workers never raise across threads (see ``worker.py``): they catch, describe the failure here and
put it on their out-queue; the caller raises ``poptorch_sim.Error`` from the original exception,
so the original traceback stays attached as ``__cause__``.
"""

from __future__ import annotations

import linecache
import re
import traceback
from dataclasses import dataclass

from torch import fx, nn

from ..errors import Error

__all__ = ["StageFailure", "graph_node_of"]

_ASSIGNED = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")


@dataclass
class StageFailure:
    """A stage's exception with where it happened.

    Attributes:
        stage: the failing stage.
        ipu: its IPU.
        mb: the micro-batch (``None`` for the optimizer step).
        phase: ``"forward"``, ``"backward"``, ``"optimizer step"``, ``"receive"``...
        exc: the original exception (with its traceback).
        node: the fx graph node that was executing, when the stage is an fx ``GraphModule``.
    """

    stage: int
    ipu: int
    mb: int | None
    phase: str
    exc: BaseException
    node: str | None = None

    def message(self) -> str:
        """``stage 1 (IPU 1) failed in forward of micro-batch 3: ValueError: ...``."""
        of_mb = f" of micro-batch {self.mb}" if self.mb is not None else ""
        notes = getattr(self.exc, "__notes__", None) or []
        text = "\n".join([f"{type(self.exc).__name__}: {self.exc}", *notes])
        lines = [f"stage {self.stage} (IPU {self.ipu}) failed in {self.phase}{of_mb}: {text}"]
        if self.node is not None:
            lines.append(f"While executing {self.node}")
        return "\n".join(lines)

    def error(self) -> Error:
        """The ``poptorch_sim.Error`` to raise (``raise failure.error() from failure.exc``)."""
        return Error(self.message())


def graph_node_of(exc: BaseException, module: nn.Module) -> str | None:
    """The fx node of ``module`` whose generated line raised ``exc``, formatted like fx does.

    Looks for the innermost traceback frame in fx-generated code (``eval_with_key``), reads the
    variable assigned on that line and finds the node of that name; adds the user's source line
    from the node's ``stack_trace`` when tracing recorded one.
    """
    if not isinstance(module, fx.GraphModule) or exc.__traceback__ is None:
        return None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "eval_with_key" in f.filename]
    if not frames:
        return None
    frame = frames[-1]
    line = frame.line or linecache.getline(frame.filename, frame.lineno or 0)
    match = _ASSIGNED.match(line or "")
    if match is None:
        return None
    for node in module.graph.nodes:
        if node.name == match.group(1):
            described: str = node.format_node() or node.name
            stack = (node.meta.get("stack_trace") or "").strip().splitlines()
            return described + (f"\nOriginal code: {stack[-1].strip()}" if stack else "")
    return None
