"""Routes of a staged program: which stage (or the host) sends which named value to which stage.

The schedule only knows stages by number; the routes say what a SEND or RECV moves. A value may
skip stages (stage 0 → stage 2) and may have several consumers; the host both feeds program
inputs to every stage that reads them and receives the program outputs from whichever stage
makes them::

    host ──x──► stage 0 ──h──► stage 1 ──y──► stage 2 ──loss──► host
                   └──────────────skip─────────────►┘
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Error
from ..program import StagedProgram

__all__ = ["HOST", "Routes", "routes_of"]

HOST = -1  # the producer id of program inputs


@dataclass(frozen=True)
class Routes:
    """The value plumbing of a program, indexed by stage.

    Attributes:
        producer: for each value name, the stage that makes it (``HOST`` for program inputs).
        inputs_from: for each stage, ``{producer stage or HOST: names it reads from there}``.
        outputs_to: for each stage, ``{consumer stage: names it sends there}``.
        to_host: for each stage, the program output names it sends to the host.
        loss_stage: the stage that makes ``loss_name`` (``None`` in inference).
    """

    producer: dict[str, int]
    inputs_from: tuple[dict[int, tuple[str, ...]], ...]
    outputs_to: tuple[dict[int, tuple[str, ...]], ...]
    to_host: tuple[tuple[str, ...], ...]
    loss_stage: int | None

    def upstream(self, stage: int) -> list[int]:
        """Stages (not the host) that send activations to ``stage``."""
        return [src for src in self.inputs_from[stage] if src != HOST]

    def downstream(self, stage: int) -> list[int]:
        """Stages that receive activations from ``stage`` (and send it gradients back)."""
        return list(self.outputs_to[stage])


def _producers(program: StagedProgram) -> dict[str, int]:
    producer = {name: HOST for name in program.input_names}
    for spec in program.stages:
        for name in spec.outputs:
            if name in producer:
                where = "a program input" if producer[name] == HOST else f"stage {producer[name]}"
                raise Error(
                    f"value {name!r} is produced by stage {spec.index} but is already {where}; "
                    "each value must have exactly one producer"
                )
            producer[name] = spec.index
    return producer


def _check_stages(program: StagedProgram) -> None:
    if not program.stages:
        raise Error("the staged program has no stages")
    indices = [spec.index for spec in program.stages]
    if indices != list(range(len(indices))):
        raise Error(f"stages must be numbered 0..N-1 in order, got indices {indices}")


def routes_of(program: StagedProgram) -> Routes:
    """Work out the routes of ``program`` and check that every value has a producer upstream.

    Raises:
        Error: a stage reads a value that no earlier stage (nor the host) makes, an output or
            the loss has no producer, or stages are misnumbered.
    """
    _check_stages(program)
    producer = _producers(program)
    n = len(program.stages)
    inputs_from: list[dict[int, list[str]]] = [{} for _ in range(n)]
    outputs_to: list[dict[int, list[str]]] = [{} for _ in range(n)]
    for spec in program.stages:
        for name in spec.inputs:
            src = producer.get(name)
            if src is None or src >= spec.index:
                made = "nowhere" if src is None else f"by stage {src}"
                raise Error(
                    f"stage {spec.index} reads {name!r}, which is made {made}; a stage may only "
                    f"read program inputs {list(program.input_names)} or outputs of earlier stages"
                )
            inputs_from[spec.index].setdefault(src, []).append(name)
            if src != HOST:
                outputs_to[src].setdefault(spec.index, []).append(name)
    wanted = list(program.output_names)
    if program.loss_name is not None:
        wanted.append(program.loss_name)
    for name in wanted:
        if producer.get(name, HOST) == HOST and name not in program.input_names:
            raise Error(
                f"program output {name!r} is not made by any stage "
                f"(stage outputs: {[list(s.outputs) for s in program.stages]})"
            )
    to_host = tuple(
        tuple(name for name in program.output_names if producer.get(name) == s) for s in range(n)
    )
    return Routes(
        producer=producer,
        inputs_from=tuple({k: tuple(v) for k, v in d.items()} for d in inputs_from),
        outputs_to=tuple({k: tuple(v) for k, v in d.items()} for d in outputs_to),
        to_host=to_host,
        loss_stage=producer.get(program.loss_name) if program.loss_name is not None else None,
    )
