"""Shared fixtures: every test starts from the same seed, with a SIMD choice cache of its own."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile

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
