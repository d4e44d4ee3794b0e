"""PopTorch's data loading: ``DataLoader`` (combined batches) and ``AsynchronousDataAccessor``."""

from __future__ import annotations

from .accessor import AsynchronousDataAccessor
from .loader import DataLoader

__all__ = ["AsynchronousDataAccessor", "DataLoader"]
