"""Datasets for PopTorch programs on machines without network access (MNIST and its stand-in)."""

from __future__ import annotations

from .mnist_standin import MNIST_FILES, Source, ensure_mnist, raw_folder, write_standin

__all__ = ["MNIST_FILES", "Source", "ensure_mnist", "raw_folder", "write_standin"]
