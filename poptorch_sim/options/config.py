"""Options from files and strings: PopTorch's config-file format, JSON and YAML."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .. import enums

__all__ = ["ConfigFileError", "apply_config_file", "apply_mapping", "parse_json"]


class ConfigFileError(Exception):
    """A configuration file could not be parsed."""


def apply_config_file(options: Any, filepath: str) -> None:
    """Apply ``filepath`` to ``options``.

    A ``.yaml``/``.yml`` file holds a mapping ``{"Training.gradientAccumulation": 4, ...}`` (the
    ``from_json`` format); any other file holds PopTorch's format: one setter call per line,
    written without the ``options.`` prefix (``deviceIterations(4)``), ``#`` comments allowed.

    Raises:
        ConfigFileError: a line is not valid Python, or the YAML is not a mapping.
    """
    if filepath.endswith((".yaml", ".yml")):
        _apply_yaml(options, filepath)
        return
    name = os.path.basename(filepath)
    with open(filepath, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    commands = [f"options.{line}" for line in lines if line and not line.startswith("#")]
    import poptorch_sim

    from .. import ops  # noqa: F401  (config lines may name poptorch.* values)

    try:
        code = compile("\n".join(commands), name, "exec")
    except SyntaxError as err:
        raise ConfigFileError(
            f"{type(err).__name__} at line {err.lineno} of {name}: {err.msg}\n> {err.text}"
        ) from None
    exec(code, {}, {"poptorch": poptorch_sim, "options": options})


def _apply_yaml(options: Any, filepath: str) -> None:
    import yaml

    with open(filepath, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise ConfigFileError(
                f"{os.path.basename(filepath)} is not valid YAML: {err}"
            ) from None
    if not isinstance(data, Mapping):
        raise ConfigFileError(
            f"{os.path.basename(filepath)} must hold a mapping of option setters to values, "
            f"got {type(data).__name__}"
        )
    apply_mapping(options, data)


def parse_json(string: str) -> Mapping[str, Any]:
    """Parse a ``from_json`` string into a mapping."""
    data = json.loads(string)
    if not isinstance(data, Mapping):
        raise ValueError(f"Options JSON must be an object, got {string!r}")
    return data


def apply_mapping(options: Any, data: Mapping[str, Any]) -> None:
    """Call ``options.<dotted.setter>(value)`` for each entry; a list value is spread as args.

    ``"Enum.Member"`` strings become the enum member (``"OutputMode.All"``).
    """
    for accessor, value in data.items():
        target = options
        for part in accessor.split("."):
            target = getattr(target, part)
        value = _to_enum(value)
        if isinstance(value, list):
            target(*[_to_enum(v) for v in value])
        else:
            target(value)


def _to_enum(value: Any) -> Any:
    if not isinstance(value, str) or value.count(".") != 1:
        return value
    enum_name, member = value.split(".")
    enum_type = getattr(enums, enum_name, None)
    return getattr(enum_type, member, value) if enum_type is not None else value
