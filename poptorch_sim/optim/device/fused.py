"""``FusedOptimizer``: the runtime's optimizer step on the fused kernels, state on/off-chip.

CPU parameters step on the C++ tile kernels, CUDA parameters on their generic torch
implementations (:mod:`poptorch_sim.kernels.generic`), both called through the op wrappers of
:mod:`poptorch_sim.kernels`; on-chip state lives beside its parameter, off-chip state in
host memory (pinned for CUDA parameters) and is streamed through the device in chunks.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from ...kernels import (
    TILE_ELEMENTS,
    adam_step_,
    grad_norm,
    increment_steps_,
    lamb_step_,
    rmsprop_step_,
    sgd_step_,
)
from .hyperparameters import DEFAULTS, KINDS, check_accum_type, checked_hyperparameters
from .param_state import ParamStateDict

__all__ = ["FusedOptimizer"]


class FusedOptimizer:
    """An optimizer whose ``step`` runs one fused update per parameter group.

    ``step()`` reads ``p.grad`` (already reduced over accumulation steps and replicas, still
    multiplied by ``loss_scaling``), divides by ``loss_scaling``, clips to ``max_grad_norm``
    like ``torch.nn.utils.clip_grad_norm_`` over all params, then updates params and state in
    place, exactly as ``p.grad /= loss_scaling; clip_grad_norm_(...); torch_opt.step()`` would.
    ``p.grad`` itself is left untouched. With ``off_chip=True`` the state is streamed through a
    staging buffer of ``chunk_elements`` per state tensor (see [Note: off-chip optimizer
    state]); the results are bit-identical to ``off_chip=False``.

    Args:
        kind: ``"sgd"``, ``"adam"``, ``"adamw"``, ``"rmsprop"`` or ``"lamb"``.
        params: an iterable of tensors or of param-group dicts ``{"params": [...], "lr": ...}``;
            missing hyper-parameters take torch's defaults (PopTorch's for LAMB).
        loss_scaling: the factor the loss was multiplied by (default 1.0).
        max_grad_norm: global gradient norm clip (default inf: no clipping).
        accum_type: dtype of the gradient accumulators the runtime keeps (float32/float16).
        first_order_momentum_accum_type: dtype of exp_avg / momentum_buffer / grad_avg.
        second_order_momentum_accum_type: dtype of exp_avg_sq / square_avg.
        off_chip: keep the state "off-chip" and stream it in chunks during the update.
        chunk_elements: staging size in elements per state tensor (rounded down to whole
            tiles of 1024, at least one tile).

    Raises:
        ValueError: unknown kind or hyper-parameter, AMSGrad.
        AssertionError: accumulation type other than float32/float16 (as PopTorch).

    >>> w = torch.nn.Parameter(torch.ones(3)); w.grad = torch.ones(3)
    >>> FusedOptimizer("sgd", [w], loss_scaling=1.0).step()
    """

    def __init__(
        self,
        kind: str,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        *,
        loss_scaling: float = 1.0,
        max_grad_norm: float = math.inf,
        accum_type: torch.dtype = torch.float32,
        first_order_momentum_accum_type: torch.dtype = torch.float32,
        second_order_momentum_accum_type: torch.dtype = torch.float32,
        off_chip: bool = False,
        chunk_elements: int = 1 << 20,
    ) -> None:
        if kind not in DEFAULTS:
            raise ValueError(f"unknown optimizer kind {kind!r} (known kinds: {', '.join(KINDS)})")
        for dtype in (accum_type, first_order_momentum_accum_type,
                      second_order_momentum_accum_type):  # fmt: skip
            check_accum_type(dtype)
        self.kind = kind
        self.accum_type = accum_type
        self.state_dtypes = (first_order_momentum_accum_type, second_order_momentum_accum_type)
        self.off_chip = off_chip
        self.chunk_elements = max(TILE_ELEMENTS, chunk_elements // TILE_ELEMENTS * TILE_ELEMENTS)
        self.loss_scaling = float(loss_scaling)
        self.max_grad_norm = float(max_grad_norm)
        self.param_groups: list[dict[str, Any]] = []
        # Also resets `_kept`, per group: (state version, params, their state dicts, the state
        # names asked for) at the last step.
        self.state = ParamStateDict()
        items = list(params)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
        for group in groups:
            self._add_group(group)

    def __repr__(self) -> str:
        where = f"off-chip, chunk {self.chunk_elements}" if self.off_chip else "on-chip"
        return (f"FusedOptimizer({self.kind}, {len(self.param_groups)} group(s), "
                f"loss_scaling={self.loss_scaling}, max_grad_norm={self.max_grad_norm}, "
                f"state {where})")  # fmt: skip

    # ------------------------------------------------------------------ configuration

    def _add_group(self, group: dict[str, Any]) -> None:
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        new = dict(DEFAULTS[self.kind])
        new.update(self._checked_hyper(group))
        new["params"] = params
        self.param_groups.append(new)

    def _checked_hyper(self, group: dict[str, Any]) -> dict[str, Any]:
        return checked_hyperparameters(self.kind, group)

    def set_hyperparameters(
        self,
        groups: Sequence[dict[str, Any]],
        *,
        loss_scaling: float | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        """Updates hyper-parameters in place (PopTorch's ``setOptimizer``); state is kept.

        Args:
            groups: one dict per param group (e.g. a torch optimizer's ``param_groups``);
                their ``params`` entries are ignored.
            loss_scaling: new loss scaling, if given.
            max_grad_norm: new clipping norm, if given.

        Raises:
            ValueError: a different number of groups, or an unknown hyper-parameter.
        """
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"set_hyperparameters got {len(groups)} param groups but the optimizer has "
                f"{len(self.param_groups)}"
            )
        for mine, new in zip(self.param_groups, groups):
            mine.update(self._checked_hyper(new))
        if loss_scaling is not None:
            self.loss_scaling = float(loss_scaling)
        if max_grad_norm is not None:
            self.max_grad_norm = float(max_grad_norm)

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def step(self, grads: Sequence[Tensor | None] | None = None) -> None:
        """Unscales, clips and applies one update to every param that has a gradient.

        Args:
            grads: gradients to use instead of ``p.grad``, one per param in group order
                (``None`` skips that param); e.g. float16 accumulators of float32 params,
                which torch does not allow as ``.grad``.
        """
        sizes = [len(g["params"]) for g in self.param_groups]
        if grads is None:
            grads = [p.grad for g in self.param_groups for p in g["params"]]
        elif len(grads) != sum(sizes):
            raise ValueError(f"step got {len(grads)} grads for {sum(sizes)} params")
        work = []  # (group, params with a gradient, their gradients)
        offset = 0
        for group, size in zip(self.param_groups, sizes):
            params, gs = group["params"], list(grads[offset : offset + size])
            offset += size
            if any(g is None for g in gs):
                live = [(p, g) for p, g in zip(params, gs) if g is not None]
                params, gs = [p for p, _ in live], [g for _, g in live]
            if params:
                work.append((group, params, gs))
        clip = self._clip_coef([g for _, _, gs in work for g in gs])
        chunk = self.chunk_elements if self.off_chip else 0
        placed = [p for _, params, _ in work for p in params]
        self._place_states(placed)
        # The direct C++ bindings serve CPU tensors; others go through the dispatcher to their
        # device's kernel (see poptorch_sim/kernels/generic/).
        direct = not any(p.device.type != "cpu" for p in placed)
        common = dict(loss_scaling=self.loss_scaling, clip_coef=clip, chunk_elements=chunk,
                      direct=direct)  # fmt: skip
        step_kind = getattr(self, f"_step_{self.kind}")
        for group, params, gs in work:
            step_kind(group, params, gs, common)

    def _clip_coef(self, grads: list[Tensor]) -> float:
        if math.isinf(self.max_grad_norm) or not grads:
            return 1.0
        total = grad_norm(grads, self.loss_scaling)
        # The same float32 arithmetic as torch.nn.utils.clip_grad_norm_.
        coef = self.max_grad_norm / (total + 1e-6)
        return float(torch.clamp(coef, max=1.0))

    def _zeros(self, p: Tensor, order: int) -> Tensor:
        home, pin = self._home(p)
        return torch.zeros(p.shape, dtype=self.state_dtypes[order], device=home, pin_memory=pin)

    def _home(self, p: Tensor) -> tuple[torch.device, bool]:
        """Where ``p``'s state lives: beside ``p`` on chip, in host memory off chip.

        Off-chip state of a CUDA parameter is pinned (the second value), so each streamed
        chunk is copied to the device asynchronously (see [Note: generic off-chip streaming]).
        """
        if not self.off_chip:
            return p.device, False
        return torch.device("cpu"), p.device.type == "cuda"

    def _placed(self, p: Tensor, state: Tensor) -> Tensor:
        """``state`` moved (if it is not there yet) to where ``p``'s state lives."""
        home, pin = self._home(p)
        if state.device == home and (not pin or state.is_pinned()) and state.is_contiguous():
            return state
        moved = state.to(home).contiguous()
        return moved.pin_memory() if pin else moved

    def _place_states(self, params: list[Tensor]) -> None:
        # State loaded from a checkpoint, written by import_state, or created before the
        # runtime moved the parameters to their device is moved (once) to where it belongs.
        # CPU parameters only ever get CPU state, so their (per-step) check is skipped.
        if not any(p.is_cuda for p in params):
            return
        for p in params:
            for name, value in self.state.get(p, {}).items():
                if name != "step" and isinstance(value, Tensor):
                    self.state[p][name] = self._placed(p, value)

    @staticmethod
    def _steps(states: list[dict[str, Any]]) -> list[float]:
        """Increments each state's ``step`` tensor; returns the steps being taken."""
        return increment_steps_([st["step"] for st in states], direct=True)

    def _step_sgd(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor],
                  common: dict) -> None:  # fmt: skip
        hyper = {k: group[k] for k in ("lr", "momentum", "dampening", "weight_decay",
                                       "nesterov", "maximize")}  # fmt: skip
        if group["momentum"] == 0:
            sgd_step_(params, grads, [], first_step=False, **hyper, **common)
            return
        fresh = [p for p in params if self.state.get(p, {}).get("momentum_buffer") is None]
        for p in fresh:
            self.state.setdefault(p, {})["momentum_buffer"] = self._zeros(p, 0)
        is_fresh = {id(p) for p in fresh}
        for first in (True, False):
            pairs = [(p, g) for p, g in zip(params, grads) if (id(p) in is_fresh) == first]
            if pairs:
                subset = [p for p, _ in pairs]
                bufs = [self.state[p]["momentum_buffer"] for p in subset]
                sgd_step_(subset, [g for _, g in pairs], bufs, first_step=first, **hyper,
                          **common)  # fmt: skip

    @property
    def state(self) -> ParamStateDict:
        """Per-parameter state, as ``torch.optim.Optimizer.state``."""
        return self._state

    @state.setter
    def state(self, value: dict[Tensor, dict[str, Any]]) -> None:
        self._state = value if isinstance(value, ParamStateDict) else ParamStateDict(value)
        self._kept: dict[int, tuple[int, list[Tensor], list[dict[str, Any]], frozenset[str]]] = {}

    def _init_moments(self, group: dict[str, Any], params: list[Tensor],
                      names: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:  # fmt: skip
        """Each param's state, with its ``step`` and the named moments created when missing.

        The list is kept for the group's next step while neither the state's entries nor the
        params change (see ``ParamStateDict``).
        """
        kept = self._kept.get(id(group))
        want = frozenset({"step", *(name for name, _ in names)})
        if (kept is not None and kept[0] == self.state.version and len(kept[1]) == len(params)
                and kept[3] == want and all(map(operator.is_, kept[1], params))):  # fmt: skip
            return kept[2]
        states = []
        for p in params:
            st = self.state.get(p)
            if st is None or not want <= st.keys() or not isinstance(st["step"], Tensor):
                st = self.state.setdefault(p, {})
                step = st.get("step")
                if not isinstance(step, Tensor):
                    # Written as a number (torch's LAMB-style int, or an imported ipu_state
                    # for a parameter not stepped yet): the kernels count in a float32 tensor.
                    st["step"] = torch.tensor(float(step or 0), dtype=torch.float32)
                for name, order in names:
                    if st.get(name) is None:
                        st[name] = self._zeros(p, order)
            states.append(st)
        self._kept[id(group)] = (self.state.version, list(params), states, want)
        return states

    def _step_adam(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor],
                   common: dict) -> None:  # fmt: skip
        states = self._init_moments(group, params, (("exp_avg", 0), ("exp_avg_sq", 1)))
        beta1, beta2 = group["betas"]
        adam_step_(
            params, grads, [st["exp_avg"] for st in states],
            [st["exp_avg_sq"] for st in states], self._steps(states), lr=group["lr"],
            beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
            decoupled_weight_decay=self.kind == "adamw",
            bias_correction=group.get("bias_correction", True), maximize=group["maximize"],
            **common,
        )  # fmt: skip

    _step_adamw = _step_adam

    def _step_rmsprop(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor],
                      common: dict) -> None:  # fmt: skip
        names = [("square_avg", 1)]
        if group["momentum"] > 0:
            names.append(("momentum_buffer", 0))
        if group["centered"]:
            names.append(("grad_avg", 0))
        states = self._init_moments(group, params, names)
        self._steps(states)
        lists = {n: [st[n] for st in states] for n, _ in names}
        rmsprop_step_(
            params, grads, lists["square_avg"], lists.get("momentum_buffer", []),
            lists.get("grad_avg", []), lr=group["lr"], alpha=group["alpha"], eps=group["eps"],
            weight_decay=group["weight_decay"], momentum=group["momentum"],
            centered=group["centered"], maximize=group["maximize"],
            use_tf_variant=group["use_tf_variant"], **common,
        )  # fmt: skip

    def _step_lamb(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor],
                   common: dict) -> None:  # fmt: skip
        states = self._init_moments(group, params, (("exp_avg", 0), ("exp_avg_sq", 1)))
        beta1, beta2 = group["betas"]
        lamb_step_(
            params, grads, [st["exp_avg"] for st in states],
            [st["exp_avg_sq"] for st in states], self._steps(states), lr=group["lr"],
            beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
            max_weight_norm=group["max_weight_norm"], bias_correction=group["bias_correction"],
            **common,
        )  # fmt: skip

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The state in ``torch.optim.Optimizer.state_dict()`` layout (params by index).

        The tensors are the live state (not copies), as torch returns them.
        """
        index: dict[Tensor, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(p, len(index))
                ids.append(index[p])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[p]: dict(st) for p, st in self.state.items() if p in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state saved by ``state_dict()`` here or by the matching torch optimizer.

        Hyper-parameters of the saved groups replace the current ones; state tensors are
        copied into this optimizer's state dtypes.

        Raises:
            ValueError: the group structure differs from this optimizer's.
        """
        saved_groups = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in self.param_groups]
        saved_sizes = [len(g["params"]) for g in saved_groups]
        if sizes != saved_sizes:
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of "
                f"optimizer's group: saved group sizes {saved_sizes}, optimizer's {sizes}"
            )
        by_index: dict[Any, Tensor] = {}
        for group, saved in zip(self.param_groups, saved_groups):
            group.update(self._checked_hyper(saved))
            by_index.update(zip(saved["params"], group["params"]))
        self.state = {}
        for key, saved_state in state_dict["state"].items():
            p = by_index[key]
            self.state[p] = {name: self._loaded(p, name, v) for name, v in saved_state.items()}

    def _loaded(self, p: Tensor, name: str, value: Any) -> Any:
        if name == "step":
            return torch.tensor(float(value), dtype=torch.float32)
        if not isinstance(value, Tensor):
            return value
        order = 1 if name in ("exp_avg_sq", "square_avg") else 0
        loaded = value.detach().to(self.state_dtypes[order], copy=True).contiguous()
        return self._placed(p, loaded)
