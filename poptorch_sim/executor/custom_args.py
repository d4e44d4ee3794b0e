"""Custom argument types: ``ICustomArgParser`` and ``registerCustomArgParser``."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["ICustomArgParser", "registerCustomArgParser", "parser_for", "registered_parsers"]


class ICustomArgParser(abc.ABC):
    """Tells poptorch_sim how to find the tensors inside a custom input type."""

    @abc.abstractmethod
    def yieldTensors(self, struct: Any) -> Iterator[torch.Tensor]:
        """Yield every tensor in ``struct``, in a fixed order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure: Any, tensor_iterator: Iterator[torch.Tensor]) -> Any:
        """Rebuild ``original_structure`` taking its tensors, in order, from ``tensor_iterator``."""


_parsers: dict[type, ICustomArgParser] = {}


def registerCustomArgParser(arg_data_type: type, arg_parser: ICustomArgParser | None) -> None:
    """Use ``arg_parser`` for inputs of type ``arg_data_type`` (``None`` removes it).

    >>> registerCustomArgParser(MyBatch, MyBatchParser())  # doctest: +SKIP
    """
    if arg_parser is None:
        _parsers.pop(arg_data_type, None)
        return
    if not isinstance(arg_parser, ICustomArgParser):
        raise AssertionError(
            f"arg_parser must be an ICustomArgParser, got {type(arg_parser).__name__}"
        )
    _parsers[arg_data_type] = arg_parser
    _register_pytree(arg_data_type)


def _register_pytree(cls: type) -> None:
    # Outputs are flattened with torch's pytree: teach it the custom type, so its tensors are
    # joined over micro-batches like any other output.
    if cls in pytree.SUPPORTED_NODES:
        return

    def flatten(obj: Any) -> tuple[list[Any], Any]:
        parser = _parsers.get(cls)  # None once unregistered: the object is kept whole
        return (list(parser.yieldTensors(obj)) if parser else []), obj

    def unflatten(children: Any, obj: Any) -> Any:
        parser = _parsers.get(cls)
        return parser.reconstruct(obj, iter(children)) if parser else obj

    pytree.register_pytree_node(cls, flatten, unflatten)


def parser_for(value: Any) -> ICustomArgParser | None:
    """The parser registered for ``value``'s type, if any."""
    return _parsers.get(type(value)) if _parsers else None


def registered_parsers() -> dict[type, ICustomArgParser]:
    """Every registered parser by the type it parses (a copy), e.g. to hand to a loader's
    worker process."""
    return dict(_parsers)
