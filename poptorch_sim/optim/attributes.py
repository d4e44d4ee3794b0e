"""Which optimizer attributes are variable (may change after compilation) and which are constant."""

from __future__ import annotations

__all__ = ["VariableAttributes"]


class VariableAttributes:
    """Tracks which attributes of a ``poptorch.optim`` optimizer are variable or constant.

    Every PopTorch optimizer carries one as ``optimizer.variable_attrs``. An attribute passed
    explicitly to the optimizer's constructor starts variable, every other one constant. A
    constant attribute is baked into the compiled model: changing it later and calling
    ``setOptimizer`` is an error.

    Args:
        variable_attributes: the attributes that start variable.
        allowed_attributes: every attribute this optimizer knows.

    >>> attrs = VariableAttributes(["lr"], ["lr", "momentum"])
    >>> attrs.isConstant("momentum")
    True
    """

    def __init__(self, variable_attributes: list[str], allowed_attributes: list[str]) -> None:
        # PopTorch's own tests poke at these two private lists: keep their names.
        self._variable_attributes = list(variable_attributes)
        self._allowed_attributes = list(allowed_attributes)

    def isConstant(self, attr: str) -> bool:
        """Return True if ``attr`` is constant (not marked variable)."""
        return attr not in self._variable_attributes

    def markAsConstant(self, attr: str) -> None:
        """Mark ``attr`` as constant.

        Raises:
            AssertionError: ``attr`` is not an attribute of this optimizer.
        """
        self._check_known(attr)
        self._variable_attributes = [a for a in self._variable_attributes if a != attr]

    def markAsVariable(self, attr: str) -> None:
        """Mark ``attr`` as variable.

        Raises:
            AssertionError: ``attr`` is not an attribute of this optimizer.
        """
        self._check_known(attr)
        if attr not in self._variable_attributes:
            self._variable_attributes.append(attr)

    def _check_known(self, attr: str) -> None:
        if attr not in self._allowed_attributes:
            raise AssertionError(
                f"Unknown attribute {attr}, allowed values: {self._allowed_attributes}"
            )

    def __repr__(self) -> str:
        return f"VariableAttributes(variable={self._variable_attributes})"
