"""Per-replica variables: ``model.W.replicaGrouping(comm_group_type, shards, retrieval_mode)``.

[Note: replica-grouped variables]
PopTorch lets a parameter hold a different value on each group of replicas. The replicas are
split into groups by ``CommGroupType`` and the group size ``shards`` (R replicas):

    All          one group: every replica          (the call has no effect; shards ignored)
    Consecutive  R / shards groups: {0..k-1}, {k..2k-1}, ...            (k = shards)
    Orthogonal   m = R / shards groups: {0, m, 2m, ...}, {1, m+1, ...}, ...
    NoGrouping   R groups: one replica each                              (shards ignored)

On the host the parameter has one more, outer dimension: one value per group, ``[G, *shape]``;
each replica computes with ``W[group of the replica]``, of shape ``shape``. Reading the weights
back (``copyWeightsToHost``) gives ``[G, *shape]`` with ``VariableRetrievalMode.OnePerGroup``
(each group's value, as held by its first replica) and ``[R, *shape]`` with ``AllReplicas``
(each replica's value); uploading takes either shape (from ``[R, *shape]``, each group takes the
row of its first replica).

Here the device copy of such a parameter keeps the host's shape ``[G, *shape]``, as one tensor;
before each micro-batch of replica r, its module's attribute becomes the view ``W[g(r)]``.
Autograd therefore puts each replica's gradient into its group's row only, the rows are summed
over every replica and micro-batch and divided as any gradient is (``Mean``: by GA·R, the whole
replication factor, as PopART does), so each group's value is updated from its own replicas'
gradients: the all-reduce within the group. The optimizer updates the ``[G, *shape]`` tensor
element-wise, so its state (momentum, Adam's moments) is kept per group too, ``[G, *shape]``.

Refused with a ``poptorch.Error``: optimizers whose update is not element-wise (LAMB: its trust
ratio takes the norm of the whole tensor; ``max_grad_norm``: one norm over every gradient),
several processes (``Distributed``), and models with
blocks that run as a staged program.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..enums import CommGroupType, VariableRetrievalMode
from ..errors import Error

__all__ = [
    "GroupedVariable",
    "check_grouped_optimizer",
    "GroupingHandle",
    "ReplicaGrouping",
    "grouped_variables",
    "replica_groups",
]


@dataclass(frozen=True)
class ReplicaGrouping:
    """What ``replicaGrouping(comm_group_type, shards, variable_retrieval_mode)`` was given."""

    comm_group_type: CommGroupType
    shards: int
    retrieval: VariableRetrievalMode

    @classmethod
    def of(
        cls, name: str, comm_group_type: object, shards: object, mode: object
    ) -> ReplicaGrouping:
        """Check the arguments of ``replicaGrouping`` on parameter ``name``.

        Raises:
            Error: an unknown group type or retrieval mode, or a group size that is not an int.
        """
        try:
            kind = CommGroupType(int(comm_group_type))  # type: ignore[call-overload]
            retrieval = VariableRetrievalMode(int(mode))  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise Error(
                f"{name}.replicaGrouping({comm_group_type!r}, {shards!r}, {mode!r}): expected a "
                "poptorch.CommGroupType and a poptorch.VariableRetrievalMode"
            ) from None
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 0:
            raise Error(
                f"{name}.replicaGrouping: shards (the number of replicas in each group) must be "
                f"an int >= 0, got {shards!r}"
            )
        return cls(kind, shards, retrieval)


def replica_groups(grouping: ReplicaGrouping, replicas: int, name: str = "W") -> list[int]:
    """The group of each of ``replicas`` replicas (a list of length R, values 0..G-1).

    Raises:
        Error: a group size that does not divide the replication factor.
    """
    kind, k = grouping.comm_group_type, grouping.shards
    if kind == CommGroupType.All:
        return [0] * replicas
    if kind == CommGroupType.NoGrouping:
        return list(range(replicas))
    if k < 1 or replicas % k != 0:
        raise Error(
            f"{name}.replicaGrouping(CommGroupType.{kind.name}, {k}, ...): the group size "
            f"{k} must be at least 1 and divide the replication factor {replicas}. Use a "
            "group size that divides it, or CommGroupType.NoGrouping for one value per replica."
        )
    if kind == CommGroupType.Consecutive:
        return [r // k for r in range(replicas)]
    groups = replicas // k
    return [r % groups for r in range(replicas)]


class GroupedVariable:
    """One replica-grouped parameter of the device copy. See [Note: replica-grouped variables]."""

    def __init__(
        self, name: str, grouping: ReplicaGrouping, model: nn.Module, replicas: int
    ) -> None:
        self.name, self.grouping, self.replicas = name, grouping, replicas
        self.group_of = replica_groups(grouping, replicas, name)
        self.groups = max(self.group_of) + 1
        self.first_of_group = [self.group_of.index(g) for g in range(self.groups)]
        prefix, _, self.attr = name.rpartition(".")
        self.prefix = prefix
        param = model.get_submodule(prefix)._parameters.get(self.attr)
        if param is None:
            raise Error(f"replicaGrouping: the model has no parameter named {name!r}")
        if param.dim() == 0:
            raise Error("Scalars cannot be passed as per-replica weight tensor values")
        if param.shape[0] != self.groups:
            raise Error(
                f"{name}.replicaGrouping(CommGroupType.{grouping.comm_group_type.name}, "
                f"{grouping.shards}, ...) with {replicas} replicas makes {self.groups} groups, so "
                f"{name} must hold one value per group: shape [{self.groups}, ...], got "
                f"{list(param.shape)}. Stack the groups' values on a new first dimension."
            )

    @contextlib.contextmanager
    def used_by(self, root: nn.Module, replica: int) -> Iterator[None]:
        """Within the block, ``root``'s attribute is replica ``replica``'s value (a view)."""
        owner = root.get_submodule(self.prefix)
        whole = owner._parameters[self.attr]
        assert whole is not None
        owner._parameters[self.attr] = whole[self.group_of[replica]]  # type: ignore[assignment]
        try:
            yield
        finally:
            owner._parameters[self.attr] = whole

    def to_host(self, device_value: torch.Tensor) -> torch.Tensor:
        """The host's value read back, per the retrieval mode: ``[G, ...]`` or ``[R, ...]``."""
        if self.grouping.retrieval == VariableRetrievalMode.AllReplicas:
            return device_value[torch.tensor(self.group_of)].clone()
        return device_value

    def from_host(self, host_value: torch.Tensor) -> torch.Tensor:
        """The device's ``[G, ...]`` value from the host's ``[G, ...]`` or ``[R, ...]``.

        Raises:
            Error: the host value has neither outer size.
        """
        size = host_value.shape[0] if host_value.dim() > 0 else None
        if size == self.groups:
            return host_value
        if size == self.replicas:
            return host_value[torch.tensor(self.first_of_group)]
        raise Error(
            f"Cannot upload {self.name}: a replica-grouped parameter needs shape "
            f"[{self.groups}, ...] (one value per group) or [{self.replicas}, ...] (one per "
            f"replica), got {list(host_value.shape)}"
        )


@contextlib.contextmanager
def grouped_variables(
    variables: list[GroupedVariable], root: nn.Module, replica: int
) -> Iterator[None]:
    """Every grouped parameter of ``root`` set to replica ``replica``'s value in the block."""
    with contextlib.ExitStack() as stack:
        for var in variables:
            stack.enter_context(var.used_by(root, replica))
        yield


class GroupingHandle:
    """What ``model.W`` gives for a top-level parameter ``W`` of a wrapped model: the parameter
    plus ``replicaGrouping`` (recorded by that wrapper only, as in PopTorch, so the parameter
    itself carries nothing). It stands for the parameter: attributes, operators, indexing,
    torch functions and ``isinstance`` all reach the parameter."""

    def __init__(self, executor: object, name: str, param: nn.Parameter) -> None:
        self._executor, self._name, self._param = executor, name, param

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(model.W, nn.Parameter), as for the parameter
        return type(self.__dict__["_param"])

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        args, kwargs = pytree.tree_map(_unwrap, (args, kwargs or {}))
        return func(*args, **kwargs)

    def replicaGrouping(  # noqa: N802 (PopTorch's name)
        self,
        comm_group_type: CommGroupType,
        shards: int,
        variable_retrieval_mode: VariableRetrievalMode,
    ) -> None:
        """Give each group of replicas its own value of this parameter.

        See [Note: replica-grouped variables]. Call it before the model is compiled.
        """
        grouping = ReplicaGrouping.of(self._name, comm_group_type, shards, variable_retrieval_mode)
        self._executor._set_replica_grouping(self._name, grouping)  # type: ignore[attr-defined]

    def __getattr__(self, attr: str) -> object:
        return getattr(self.__dict__["_param"], attr)


def _unwrap(value: object) -> object:
    return value.__dict__["_param"] if type(value) is GroupingHandle else value


def _forward(op: str) -> Callable[..., object]:
    def method(self: GroupingHandle, *args: object) -> object:
        return getattr(self.__dict__["_param"], op)(*[_unwrap(a) for a in args])

    method.__name__ = op
    return method


for _op in (
    "__getitem__ __setitem__ __len__ __iter__ __bool__ __float__ __int__ __index__ __array__ "
    "__repr__ __str__ __format__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __neg__ "
    "__pos__ __abs__ __invert__ __add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ "
    "__rmul__ __imul__ __truediv__ __rtruediv__ __itruediv__ __floordiv__ __rfloordiv__ "
    "__mod__ __rmod__ __pow__ __rpow__ __matmul__ __rmatmul__ __and__ __rand__ __or__ __ror__ "
    "__xor__ __rxor__ __reduce_ex__ __deepcopy__ __copy__ __contains__"
).split():
    setattr(GroupingHandle, _op, _forward(_op))


def check_grouped_optimizer(grouped: Iterable[str], snapshot: object) -> None:
    """Refuse optimizers that couple a grouped parameter's groups (see the note).

    Raises:
        Error: LAMB, or a global gradient-norm clip, with replica-grouped parameters.
    """
    names = ", ".join(grouped)
    kind = getattr(snapshot, "kind", "")
    if kind == "lamb":
        raise Error(
            f"replicaGrouping() ({names}) is not supported in poptorch_sim with LAMB: its trust "
            "ratio takes the norm of the whole parameter, which would mix the groups' values. "
            "Use SGD, Adam, AdamW or RMSprop"
        )
    clip = float(getattr(snapshot, "max_grad_norm", float("inf")))
    if clip != float("inf"):
        raise Error(
            f"replicaGrouping() ({names}) is not supported in poptorch_sim with max_grad_norm "
            f"({clip}): the gradient norm would mix the groups' gradients. Leave max_grad_norm "
            "unset"
        )
