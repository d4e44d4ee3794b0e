"""Manual sharding configurations: split points from a dict pair or PopRT's YAML list, validated.

PopRT's two forms carry the same facts:

    Sharder(sharding_info={"add": 0, "add_13": 2},     - node: add        (YAML: a list of
            pipelining_info={"add": 0, "add_13": 2})     device: 0          mappings, one per
                                                         stage: 0           split point)
                                                       - node: add_13
                                                         device: 2
                                                         stage: 2

``pipelining_info`` (``stage`` in YAML) may be left out: then each split point's stage is its rank
in graph order, so sharded models may visit the IPUs in any order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ...errors import Error

__all__ = ["SplitPoint", "ShardingConfig", "ShardingError", "load_sharding_config"]

_KEYS = ("node", "device", "stage")


class ShardingError(Error):
    """A manual sharding configuration that cannot be applied (names the node and the fix)."""


@dataclass(frozen=True)
class SplitPoint:
    """One split point: ``node`` and the ancestors it claims go to ``device`` in ``stage``.

    ``stage`` is None when the configuration gives no pipelining information.
    """

    node: str
    device: int
    stage: int | None = None

    def __repr__(self) -> str:
        stage = "" if self.stage is None else f", stage={self.stage}"
        return f"SplitPoint({self.node!r}, device={self.device}{stage})"


@dataclass(frozen=True)
class ShardingConfig:
    """The split points of one model, and where they came from (for messages).

    Attributes:
        points: the split points, in the order given (the algorithm sorts them by graph order).
        source: ``"Sharder"``, ``"Options.setManualShardingConfig"``, or a YAML path.
    """

    points: tuple[SplitPoint, ...]
    source: str = "Sharder"

    @property
    def pipelined(self) -> bool:
        """Whether every split point has a stage (``pipelining_info`` was given)."""
        return all(p.stage is not None for p in self.points)

    @classmethod
    def from_info(
        cls,
        sharding_info: Mapping[str, int],
        pipelining_info: Mapping[str, int] | None = None,
        source: str = "Sharder",
    ) -> ShardingConfig:
        """The configuration of ``Sharder(sharding_info, pipelining_info)``.

        Raises:
            ShardingError: empty, non-integer devices or stages, or ``pipelining_info`` naming
                other nodes than ``sharding_info``.
        """
        if not isinstance(sharding_info, Mapping) or not sharding_info:
            raise ShardingError(
                f"{source}: sharding_info must be a non-empty dict {{node name: device}}, got "
                f"{sharding_info!r}"
            )
        if pipelining_info is not None and not isinstance(pipelining_info, Mapping):
            raise ShardingError(
                f"{source}: pipelining_info must be a dict {{node name: stage}} or None, got "
                f"{pipelining_info!r}"
            )
        if pipelining_info:
            missing = [n for n in sharding_info if n not in pipelining_info]
            extra = [n for n in pipelining_info if n not in sharding_info]
            if missing or extra:
                raise ShardingError(
                    f"{source}: sharding_info and pipelining_info must name the same split "
                    f"points; without a stage: {missing}, without a device: {extra}. Give each "
                    "split point both a device and a stage, or leave pipelining_info out."
                )
        points = tuple(
            SplitPoint(
                _name(node, source),
                _index(device, "device", node, source),
                None
                if not pipelining_info
                else _index(pipelining_info[node], "stage", node, source),
            )
            for node, device in sharding_info.items()
        )
        return cls(points, source)

    @classmethod
    def from_entries(cls, entries: Any, source: str) -> ShardingConfig:
        """The configuration of PopRT's YAML list of ``{node, device, stage}`` mappings.

        Raises:
            ShardingError: not a list of such mappings, unknown keys, or a node listed twice.
        """
        if not isinstance(entries, list) or not entries:
            raise ShardingError(
                f"{source}: a manual sharding config is a non-empty list of mappings with keys "
                f"node, device and stage (PopRT's format), got {type(entries).__name__}: "
                f"{entries!r:.200}"
            )
        seen: dict[str, int] = {}
        points = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or "node" not in entry or "device" not in entry:
                raise ShardingError(
                    f"{source}: entry {i} is {entry!r}; each entry needs 'node' and 'device' "
                    "(and 'stage' to pipeline), e.g. {node: add, device: 0, stage: 0}"
                )
            unknown = sorted(set(entry) - set(_KEYS))
            if unknown:
                raise ShardingError(
                    f"{source}: entry {i} ({entry['node']!r}) has unknown keys {unknown}; the "
                    f"keys are {', '.join(_KEYS)}"
                )
            node = _name(entry["node"], source)
            if node in seen:
                raise ShardingError(
                    f"{source}: duplicate node '{node}' (entries {seen[node]} and {i}); each "
                    "split point may appear once. Remove one of them."
                )
            seen[node] = i
            stage = entry.get("stage")
            points.append(
                SplitPoint(
                    node,
                    _index(entry["device"], "device", node, source),
                    None if stage is None else _index(stage, "stage", node, source),
                )
            )
        staged = [p.stage is not None for p in points]
        if any(staged) and not all(staged):
            lacking = [p.node for p in points if p.stage is None]
            raise ShardingError(
                f"{source}: some entries have a stage and others do not ({lacking}); give "
                "every entry a stage, or none."
            )
        return cls(tuple(points), source)

    def to_entries(self) -> list[dict[str, Any]]:
        """PopRT's list form (what ``from_entries`` reads), e.g. to write a YAML file."""
        return [
            {"node": p.node, "device": p.device} | ({} if p.stage is None else {"stage": p.stage})
            for p in self.points
        ]


def _name(node: Any, source: str) -> str:
    if not isinstance(node, str) or not node:
        raise ShardingError(f"{source}: a split point's node must be a name (str), got {node!r}")
    return node


def _index(value: Any, what: str, node: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ShardingError(
            f"{source}: the {what} of split point '{node}' must be a non-negative integer, "
            f"got {value!r}"
        )
    return value


def load_sharding_config(path: str | os.PathLike[str]) -> ShardingConfig:
    """Read PopRT's manual sharding YAML (a list of ``{node, device, stage}``) with PyYAML.

    Args:
        path: the YAML file.

    Returns:
        The ``ShardingConfig``.

    Raises:
        ShardingError: the file is missing, is not YAML, or is not in PopRT's format.

    >>> # config = load_sharding_config("shard.yaml")
    """
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as stream:
            entries = yaml.safe_load(stream)
    except OSError as exc:
        raise ShardingError(f"cannot read the manual sharding config {where!r}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ShardingError(f"the manual sharding config {where!r} is not YAML: {exc}") from None
    return ShardingConfig.from_entries(entries, where)
