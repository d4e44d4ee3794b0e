"""``TensorLocationSettings``: where a class of tensors lives (on chip, off chip, sharded)."""

from __future__ import annotations

from ._dict import OptionsDict

__all__ = ["TensorLocationSettings"]


class TensorLocationSettings(OptionsDict):
    """Storage settings for one class of tensors (weights, activations, optimizer state, ...).

    All setters are chainable. Values are stored as ints, as PopTorch stores them
    (``settings.toDict()["onChip"] == 0``).

    Simulated: only ``useOnChipStorage(False)`` on the optimizer location changes what runs
    (the optimizer state is kept in host buffers and streamed in chunks); the others are stored.

    >>> TensorLocationSettings().useOnChipStorage(False).toDict()
    {'onChip': 0}
    """

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:
        """Tensors smaller than ``min_elements`` stay on chip."""
        _check_int("min_elements", min_elements)
        self.createOrSet(minElementsForOffChip=min_elements)
        return self

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> TensorLocationSettings:
        """Tensors smaller than ``min_elements`` are not sharded across replicas."""
        _check_int("min_elements", min_elements)
        self.createOrSet(minElementsForReplicatedTensorSharding=min_elements)
        return self

    def useOnChipStorage(self, use: bool | None = True) -> TensorLocationSettings:
        """Keep these tensors in IPU memory (``True``) or in streaming memory (``False``)."""
        if use is None:
            self.deleteIfExists("onChip")
        else:
            _check_bool("use", use)
            self.createOrSet(onChip=int(use))
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        """Shard these tensors across replicas."""
        _check_bool("use", use)
        self.createOrSet(useReplicatedTensorSharding=int(use))
        return self

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:
        """Load these tensors through the IO tiles."""
        _check_bool("use", use)
        self.createOrSet(useIOTilesToLoad=int(use))
        return self

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:
        """Store these tensors through the IO tiles."""
        _check_bool("use", use)
        self.createOrSet(useIOTilesToStore=int(use))
        return self


def _check_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise AssertionError(f"{name} must be an integer value, got {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise AssertionError(f"{name} must be a bool value, got {value!r}")
