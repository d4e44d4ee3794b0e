"""Shared fixtures: every test starts from the same seed, with a SIMD choice cache of its own;
each test process computes on one intra-op thread, and ``two_threads`` runs a test with the
caller on 2."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
import torch

# The SIMD variant choices (poptorch_sim.kernels.simd_choice) go to a cache of this run's own,
# not the user's: set before poptorch_sim is imported.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="poptorch_sim_test_cache_")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)


@pytest.fixture(autouse=True)
def seed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def two_threads() -> Iterator[int]:
    """The caller runs on 2 intra-op threads (the cores the workers are lent), then as before."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


# Each test process computes on one intra-op thread: the suite runs one process per core, and on
# two cores a second intra-op thread only waits for the core the other process holds (tests of
# 7 files, two processes: 89/80 -> 66/62 s, 2-vCPU Xeon, 2026-11-28). Tests that need two ask
# for ``two_threads``.
torch.set_num_threads(1)
