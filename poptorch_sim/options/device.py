"""The device setters of ``poptorch.Options``: which IPUs, when to attach, how the model is
placed on them."""

from __future__ import annotations

import os
from typing import Self

from ..enums import ConnectionType, SyncPattern
from ._dict import OptionsDict, no_effect
from .strategies import _IExecutionStrategy

__all__ = ["DeviceSetters"]


class DeviceSetters(OptionsDict):
    """``Options``' setters of the device and of the model's placement on it (part of
    ``poptorch.Options``; its options are declared there)."""

    _execution_strategy: _IExecutionStrategy

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Self:
        """Round the number of IPUs reserved up to a power of two."""
        self.set(auto_round_num_ipus=auto_round_num_ipus)
        return self

    def useIpuModel(self, use_model: bool) -> Self:
        """Run on the IPU Model (stored; every IPU is simulated here)."""
        no_effect("useIpuModel")
        self.createOrSet(use_model=use_model)
        return self

    def useIpuId(self, ipu_id: int) -> Self:
        """Use the device with this id."""
        if not isinstance(ipu_id, int) or ipu_id < 0:
            raise AssertionError(f"ipu_id must be a non-negative integer, got {ipu_id!r}")
        self.createOrSet(ipu_id=ipu_id)
        return self

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Self:
        """Compile for an IPU of ``ipu_version`` without attaching to one."""
        self.connectionType(ConnectionType.Never)
        self.createOrSet(ipu_version=ipu_version)
        return self

    def connectionType(self, connection_type: ConnectionType) -> Self:
        """When to attach: Always, OnDemand or Never (offline compilation)."""
        if not isinstance(connection_type, ConnectionType):
            raise AssertionError(
                f"connection_type must be a poptorch.ConnectionType, got {connection_type!r}"
            )
        self.set(connection_type=int(connection_type))
        return self

    def syncPattern(self, sync_pattern: SyncPattern) -> Self:
        """Host synchronisation pattern (stored)."""
        if not isinstance(sync_pattern, SyncPattern):
            raise AssertionError(
                f"sync_pattern must be a poptorch.SyncPattern, got {sync_pattern!r}"
            )
        no_effect("syncPattern")
        self.set(sync_pattern=int(sync_pattern))
        return self

    def setExecutionStrategy(self, strategy: _IExecutionStrategy) -> Self:
        """Pipelined (default), Sharded, SerialPhased or ParallelPhased execution."""
        if not isinstance(strategy, _IExecutionStrategy):
            raise AssertionError(
                f"strategy must be an execution strategy (PipelinedExecution, "
                f"ShardedExecution, ...), got {type(strategy).__name__}"
            )
        self._execution_strategy = strategy
        return self

    def setManualShardingConfig(self, config: str | os.PathLike[str] | list[dict]) -> Self:
        """Cut the model at named nodes, PopRT's way (instead of by blocks).

        Simulated (PopRT, not PopTorch): the same as ``poprt --manual_sharding_config``. The
        config is PopRT's list of ``{node, device, stage}`` (a YAML file read with PyYAML, or
        the list itself); see ``poptorch_sim.Sharder`` for the rule and
        ``poptorch_sim.list_nodes`` for the node names. Node names are checked when the model
        compiles.

        Args:
            config: path of the YAML file, or the list of entries.

        Raises:
            poptorch_sim.compiler.sharding.ShardingError: unreadable file, not PopRT's format,
                or a node listed twice.

        >>> opts = Options().setManualShardingConfig([{"node": "add", "device": 0, "stage": 0}])
        """
        from ..compiler.sharding.config import ShardingConfig, load_sharding_config

        if isinstance(config, list):
            parsed = ShardingConfig.from_entries(config, "Options.setManualShardingConfig")
        else:
            parsed = load_sharding_config(config)
        self.createOrSet(manual_sharding=(parsed.to_entries(), parsed.source))
        return self

    def setAvailableMemoryProportion(self, available_memory_proportion: dict[str, float]) -> Self:
        """Proportion of tile memory for temporaries, per IPU: ``{"IPU0": 0.5}``.

        Raises:
            AssertionError: not a dict of ``"IPU<n>"`` keys (PopTorch's type).
            ValueError: ``<n>`` is not an index, or a value is not in (0, 1].
        """
        if not isinstance(available_memory_proportion, dict) or not all(
            isinstance(k, str) and k.startswith("IPU") for k in available_memory_proportion
        ):
            raise AssertionError(
                "Available memory proportions are expected to be in a dictionary of "
                '{"IPU0": 0.5} where the 0 in IPU0 is the index of the IPU. Invalid key: '
                f"{available_memory_proportion!r}"
            )
        for key, value in available_memory_proportion.items():
            if not key[3:].isdigit():  # PopTorch's int(key[3:]) raises ValueError too
                raise ValueError(
                    f"Invalid key: {key!r}: expected 'IPU' followed by the index of an IPU, "
                    'e.g. {"IPU0": 0.5}'
                )
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not 0.0 < value <= 1.0:
                raise ValueError(
                    f"The available memory proportion of {key} must be a number in (0, 1], got "
                    f"{value!r}: it is the proportion of tile memory ops may use for temporary "
                    "data"
                )
        no_effect("setAvailableMemoryProportion")
        self.createOrSet(available_memory_proportion=dict(available_memory_proportion))
        return self
