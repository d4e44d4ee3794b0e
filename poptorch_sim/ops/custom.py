"""``custom_op`` and the registry of Python implementations that stand in for PopART ops.

[Note: custom ops in the simulator]
On an IPU ``custom_op`` runs an op compiled into a PopART shared library. Such a library cannot
run here, so the simulator keeps a registry ``(name, domain) -> Python function``: register an
implementation with ``register_custom_op`` (also usable as a decorator) and ``custom_op`` calls
it as ``fn(*inputs, **attributes)``. Written with torch operations, it is differentiable, so the
op trains as a PopART op with a gradient op would. The attribute checks are PopTorch's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import createPoptorchError
from ..logger import logger
from .fx_leaf import fx_leaf, is_proxy

__all__ = ["custom_op", "register_custom_op", "unregister_custom_op", "registered_custom_ops"]

CustomOpFn = Callable[..., Any]
_registry: dict[tuple[str, str], CustomOpFn] = {}
_registry_lock = threading.Lock()
_warned: set[tuple[str, str, int]] = set()
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def register_custom_op(name: str, domain: str, fn: CustomOpFn | None = None) -> Any:
    """Register the Python implementation of the custom op ``(name, domain)``.

    Args:
        name: the op's name, as passed to ``custom_op``.
        domain: the op's domain.
        fn: ``fn(*inputs, **attributes) -> tensor | sequence of tensors``; when omitted,
            returns a decorator.

    Returns:
        ``fn`` (or a decorator registering the function it decorates).

    >>> @register_custom_op("Cube", "com.acme")
    ... def cube(x, bias):
    ...     return x * x * x, x * bias
    """
    if fn is None:
        return lambda f: register_custom_op(name, domain, f)
    if not callable(fn):
        raise TypeError(f"register_custom_op expects a callable implementation; got {fn!r}")
    with _registry_lock:
        _registry[(name, domain)] = fn
    return fn


def unregister_custom_op(name: str, domain: str) -> None:
    """Remove the implementation of ``(name, domain)`` (no error when there is none)."""
    with _registry_lock:
        _registry.pop((name, domain), None)


def registered_custom_ops() -> list[tuple[str, str]]:
    """The ``(name, domain)`` pairs that have an implementation."""
    with _registry_lock:
        return sorted(_registry)


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor) or is_proxy(value)


def _check_float_range(value: float) -> None:
    if value > _FLOAT32_MAX:
        raise createPoptorchError(f"{value:g} is too high for a Popart float attribute.")
    if value < -_FLOAT32_MAX:
        raise createPoptorchError(f"{value:g} is too low for a Popart float attribute.")


def _check_ascii(value: Any) -> None:
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_ascii(item)
    elif isinstance(value, str) and any(ord(ch) >= 128 for ch in value):
        raise ValueError(f"{value} contains non-ASCII characters.")


def _check_attributes(attributes: dict[str, Any]) -> None:
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise ValueError("All attribute keys must be strings.")
        if not isinstance(value, (float, int, str, list, tuple)):
            raise ValueError(
                "Attribute values must be floats, ints, strings or a list/tuple of float, "
                "ints of strings."
            )
        if isinstance(value, (list, tuple)) and value:
            if any(not isinstance(v, type(value[0])) for v in value):
                raise ValueError("The types in a list/tuple attribute must all be the same.")
    for key, value in attributes.items():
        _check_ascii(key)
        _check_ascii(value)
    for value in attributes.values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, float):
                _check_float_range(item)


def _as_list(values: Any) -> list[Any]:
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _lookup(name: str, domain: str, domain_version: int) -> CustomOpFn:
    with _registry_lock:
        fn = _registry.get((name, domain))
    if fn is None:
        raise createPoptorchError(
            f"custom_op: no implementation of the custom op '{name}' (domain '{domain}', "
            f"version {domain_version}). A PopART custom-op library cannot run in the "
            "simulator: register a Python implementation with "
            f"poptorch_sim.register_custom_op({name!r}, {domain!r}, fn), where "
            "fn(*inputs, **attributes) returns the op's outputs."
        )
    return fn


def _check_outputs(name: str, outputs: list[Any], examples: Sequence[torch.Tensor]) -> None:
    if len(outputs) != len(examples):
        raise createPoptorchError(
            f"custom_op '{name}': the implementation returned {len(outputs)} output(s) but "
            f"example_outputs has {len(examples)}; they must match."
        )
    for index, (out, example) in enumerate(zip(outputs, examples)):
        if not isinstance(out, torch.Tensor):
            raise createPoptorchError(
                f"custom_op '{name}': output {index} of the implementation is a "
                f"{type(out).__name__}, not a torch.Tensor."
            )
        same = out.shape == example.shape and out.dtype == example.dtype
        key = (name, str(example.shape), index)
        if not same and key not in _warned:
            _warned.add(key)
            logger.warning(
                "custom_op '%s': output %d has shape %s and dtype %s but its example has "
                "shape %s and dtype %s (PopART's shape inference decides on an IPU).",
                name, index, tuple(out.shape), out.dtype, tuple(example.shape), example.dtype,
            )  # fmt: skip


def _num_outputs(*args: Any, **kwargs: Any) -> int:
    examples = kwargs["example_outputs"] if "example_outputs" in kwargs else args[4]
    return len(_as_list(examples))


@fx_leaf(num_outputs=_num_outputs)
def custom_op(
    inputs: Sequence[torch.Tensor],
    name: str,
    domain: str,
    domain_version: int,
    example_outputs: Sequence[torch.Tensor],
    attributes: dict[str, Any] | None = None,
) -> list[torch.Tensor]:
    """Apply the custom op ``(name, domain)`` to ``inputs``.

    Simulated: runs the Python implementation registered with ``register_custom_op`` (see
    [Note: custom ops in the simulator]); a result whose shape or dtype differs from its
    example is returned as computed, with a warning.

    Args:
        inputs: the input tensors (a list or tuple).
        name: the op's name.
        domain: the op's domain.
        domain_version: the domain's version.
        example_outputs: tensors with the shapes and dtypes of the outputs (values unused).
        attributes: attribute name -> float, int, str, or a list/tuple of one of those types.

    Returns:
        The op's outputs, as a list with one tensor per example output.

    Raises:
        ValueError: bad attributes (PopTorch's messages).
        poptorch.Error: a float attribute outside float32's range, no registered implementation,
            or an implementation returning the wrong number of outputs.

    >>> _ = register_custom_op("AddScalar", "demo", lambda x, scalar: x + scalar)
    >>> custom_op([torch.ones(2)], "AddScalar", "demo", 1, [torch.ones(2)], {"scalar": 2.0})
    [tensor([3., 3.])]
    """
    examples = _as_list(example_outputs)
    if not all(_is_tensor(e) for e in examples):
        raise createPoptorchError("custom_op: example_outputs must all be torch.Tensor.")
    if attributes is not None:
        _check_attributes(attributes)
    fn = _lookup(name, domain, domain_version)
    outputs = _as_list(fn(*_as_list(inputs), **(attributes or {})))
    _check_outputs(name, outputs, examples)
    return outputs
