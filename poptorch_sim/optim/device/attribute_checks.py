"""Optimizer attributes a later snapshot does not know: the device ignores them, and says so.

The first snapshot of an optimizer records the names of its group and optimizer attributes;
``setOptimizer``'s snapshots report any name outside those (as a warning, or at debug level with
``Options.relaxOptimizerAttributesChecks``), once per message and model, as PopTorch's
``OptimizerAttrTracker`` does, since the compiled model cannot use it. An LR scheduler made
after the model was wrapped adds ``initial_lr`` to the groups and ``step`` to the optimizer:
PopTorch reports those too.
"""

from __future__ import annotations

import torch

from ...logger import logger

__all__ = ["known_attrs", "report_unexpected"]

_NOT_OPTIMIZER_ATTRS = frozenset({"defaults", "state", "param_groups", "variable_attrs"})


def known_attrs(optimizer: torch.optim.Optimizer) -> tuple[frozenset[str], frozenset[str]]:
    """The group attribute names and the optimizer attribute names ``optimizer`` has now.

    >>> groups, attrs = known_attrs(torch.optim.SGD([torch.zeros(1)], lr=0.1)); "lr" in groups
    True
    """
    group_names = frozenset(_group_attr_names(optimizer))
    return group_names, frozenset(_optimizer_attr_names(optimizer))


def report_unexpected(
    optimizer: torch.optim.Optimizer,
    variant: str,
    known_group: frozenset[str],
    known_optimizer: frozenset[str],
    relax_checks: bool,
    reported: set[str] | None = None,
) -> None:
    """Report attributes outside the first snapshot's: the device ignores them.

    Args:
        optimizer: the optimizer a new snapshot is taken of.
        variant: its snapshot's ``variant`` (named in the message).
        known_group, known_optimizer: the names ``known_attrs`` gave for the first snapshot.
        relax_checks: log at debug level instead of as warnings.
        reported: the messages already given for this model (not given again; updated).

    >>> report_unexpected(opt, "SGD2", *known_attrs(opt), relax_checks=False)
    """
    log = logger.debug if relax_checks else logger.warning
    found = [("default group variable", [k for k in optimizer.defaults if k not in known_group])]
    found.append(
        ("optimizer attribute", sorted(_optimizer_attr_names(optimizer) - known_optimizer))
    )
    for i, group in enumerate(optimizer.param_groups):
        extra = [k for k in group if k != "params" and k not in known_group]
        found.append((f"group {i} attribute", extra))
    seen = reported if reported is not None else set()
    for what, extra in found:
        message = f"Ignoring unexpected {what} in {variant} optimizer: {extra}"
        if extra and message not in seen:
            log(message)
            seen.add(message)


def _group_attr_names(optimizer: torch.optim.Optimizer) -> set[str]:
    names = set(optimizer.defaults)
    for group in optimizer.param_groups:
        names.update(k for k in group if k != "params")
    return names


def _optimizer_attr_names(optimizer: torch.optim.Optimizer) -> set[str]:
    # Private names belong to torch's or our machinery (hooks, LR-scheduler patches).
    return {k for k in vars(optimizer) if k not in _NOT_OPTIMIZER_ATTRS and not k.startswith("_")}
