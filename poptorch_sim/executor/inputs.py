"""Model inputs: binding a call to ``forward``'s signature and checking later calls against it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import createPoptorchError
from ..logger import logger
from .custom_args import parser_for

__all__ = ["ArgsParser", "BoundArgs"]

_MISMATCH_HINT = (
    "\nThis error occurred because the inputs passed at runtime don't match the inputs used to "
    "compile the model.\nTo recompile the model for the new inputs create a new inferenceModel / "
    "trainingModel wrapper or call destroy() on the curent one and try again."
)


@dataclass
class BoundArgs:
    """A call bound to ``forward``: positional values (defaults filled) and named extras.

    ``names[i]`` is the parameter name of ``args[i]`` (``*rest[0]`` for variadic ones).
    """

    args: tuple[Any, ...]
    names: tuple[str, ...]
    kwargs: dict[str, Any]

    def map_tensors(self, fn: Callable[[torch.Tensor], Any]) -> BoundArgs:
        """A copy with ``fn`` applied to every tensor (structure kept)."""
        return BoundArgs(
            tuple(_map(fn, a) for a in self.args),
            self.names,
            {k: _map(fn, v) for k, v in self.kwargs.items()},
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor, in argument order."""
        found: list[torch.Tensor] = []
        self.map_tensors(found.append)
        return found


def _map(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    custom = parser_for(value)
    if custom is not None:
        return custom.reconstruct(value, iter([fn(t) for t in custom.yieldTensors(value)]))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map(fn, v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _map(fn, v)) for k, v in value.items())
    return value


class ArgsParser:
    """Binds calls of a model to its ``forward`` signature, as PopTorch does.

    Args:
        model: the module (or callable) whose ``forward`` defines the arguments.
    """

    def __init__(self, model: Callable[..., Any]) -> None:
        fn = model.forward if isinstance(model, torch.nn.Module) else model
        params = list(inspect.signature(fn).parameters.values())
        self._params = params
        self._names = [p.name for p in params]
        self._variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
        self._warned_contiguous = False
        self._warned_dict = False

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BoundArgs:
        """Bind a call; raise PopTorch's errors for missing, unknown or repeated arguments."""
        if not self._variadic and len(args) + len(kwargs) > len(self._names):
            raise AssertionError(
                f"Too many arguments provided: expected {self._names} ({len(self._names)}) "
                f"but got {len(args) + len(kwargs)}"
            )
        for key in kwargs:
            if not self._variadic and key not in self._names:
                raise AssertionError(
                    f"{key} is not a valid parameter.Allowed values are {self._names}"
                )
        values: list[Any] = []
        names: list[str] = []
        named: dict[str, Any] = {}
        after_variadic = False
        for i, p in enumerate(self._params):
            if p.kind == p.VAR_KEYWORD:
                named.update({k: v for k, v in kwargs.items() if k not in self._names[:i]})
            elif p.kind == p.VAR_POSITIONAL:
                after_variadic = True
                for j, arg in enumerate(args[i:]):
                    values.append(arg)
                    names.append(f"*{p.name}[{j}]")
            elif i < len(args) and not after_variadic and p.kind != p.KEYWORD_ONLY:
                if p.name in kwargs:
                    raise AssertionError(f"Parameter {p.name} was passed more than once")
                values.append(args[i])
                names.append(p.name)
            else:
                if p.name in kwargs:
                    value = kwargs[p.name]
                elif p.default is not p.empty:
                    value = p.default
                else:
                    raise createPoptorchError(f"Mandatory parameter {p.name} missing")
                if after_variadic or p.kind == p.KEYWORD_ONLY:
                    named[p.name] = value
                else:
                    values.append(value)
                    names.append(p.name)
        bound = BoundArgs(tuple(values), tuple(names), named)
        self._warn_dicts(bound)
        return self._contiguous(bound)

    def _warn_dicts(self, bound: BoundArgs) -> None:
        if not self._warned_dict and any(isinstance(a, dict) for a in bound.args):
            self._warned_dict = True
            logger.warning(
                "Dicts as inputs only have partial support, they can be accessed using literal "
                "keys, but full Python functionality is not enabled. Consider changing dict "
                "inputs to tuple."
            )

    def _contiguous(self, bound: BoundArgs) -> BoundArgs:
        if all(t.is_contiguous() for t in bound.tensors()):
            return bound
        if not self._warned_contiguous:
            self._warned_contiguous = True
            logger.warning(
                "At least one input tensor is not contiguous: non-contiguous tensors will be "
                "converted."
            )
        return bound.map_tensors(lambda t: t.contiguous())


def validate_inputs(compiled: BoundArgs, given: BoundArgs) -> None:
    """Raise PopTorch's mismatch errors if ``given`` differs from the compiled inputs.

    Tensors must keep dtype and shape; containers their type, length and keys; every other
    value (baked into the graph at compile time) must be equal.
    """
    if len(given.args) != len(compiled.args):
        raise createPoptorchError(
            "Number of positional arguments mismatch: expected "
            f"{len(compiled.args)} arguments but got {len(given.args)}.{_MISMATCH_HINT}"
        )
    for name, c, g in zip(compiled.names, compiled.args, given.args):
        _validate(name, c, g)
    _validate_dict("named arguments", compiled.kwargs, given.kwargs, named=True)


def _validate(name: str, compiled: Any, given: Any) -> None:
    if type(compiled) is not type(given):
        raise createPoptorchError(
            f"Type mismatch for {name}: expected {type(compiled)} but got {type(given)}."
            f"{_MISMATCH_HINT}"
        )
    if isinstance(compiled, torch.Tensor):
        if compiled.dtype != given.dtype:
            raise createPoptorchError(
                f"Data type mismatch for {name}: expected {compiled.dtype} but got "
                f"{given.dtype}.{_MISMATCH_HINT}"
            )
        if compiled.shape != given.shape:
            raise createPoptorchError(
                f"Shape mismatch for {name}: expected {compiled.shape} but got "
                f"{given.shape}.{_MISMATCH_HINT}"
            )
    elif isinstance(compiled, (tuple, list)):
        if len(compiled) != len(given):
            raise createPoptorchError(
                f"Length mismatch for {name}: expected {len(compiled)} elements but got "
                f"{len(given)}.{_MISMATCH_HINT}"
            )
        for i, (c, g) in enumerate(zip(compiled, given)):
            _validate(f"{name}[{i}]", c, g)
    elif isinstance(compiled, dict):
        _validate_dict(name, compiled, given, named=False)
    elif parser_for(compiled) is not None:
        custom = parser_for(compiled)
        _validate(name, tuple(custom.yieldTensors(compiled)), tuple(custom.yieldTensors(given)))
    elif compiled is not given and compiled != given:
        raise createPoptorchError(
            f"Value mismatch for {name}: expected {compiled} but got {given}.{_MISMATCH_HINT}"
        )


def _validate_dict(name: str, compiled: dict, given: dict, named: bool) -> None:
    if set(compiled) != set(given):
        details = []
        extra = set(given) - set(compiled)
        missing = set(compiled) - set(given)
        if extra:
            details.append("Unexpected arguments: " + ", ".join(sorted(map(str, extra))))
        if missing:
            details.append("Missing arguments: " + ", ".join(sorted(map(str, missing))))
        raise createPoptorchError(
            f"Keys mismatch for {name}: {'. '.join(details)}.{_MISMATCH_HINT}"
        )
    for key, value in compiled.items():
        _validate(key if named else f"{name}[{key}]", value, given[key])
