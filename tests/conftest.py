"""Shared fixtures: every test starts from the same seed, with a SIMD choice cache of its own;
each test process computes on one intra-op thread, and ``two_threads`` runs a test with the
caller on 2.

torch and numpy are imported where a test needs them, not here: under pytest-xdist the process
that starts the workers loads this file too, and importing torch there (2.5 s) held up the
start of every worker."""

from __future__ import annotations

import atexit
import gc
import os
import random
import shutil
import tempfile
from collections.abc import Iterator

import pytest

# The SIMD variant choices (poptorch_sim.kernels.simd_choice) go to a cache of this run's own,
# not the user's: set before poptorch_sim is imported.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="poptorch_sim_test_cache_")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)


@pytest.fixture(autouse=True)
def seed() -> None:
    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def two_threads() -> Iterator[int]:
    """The caller runs on 2 intra-op threads (the cores the workers are lent), then as before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


# Each test process computes on one intra-op thread: the suite runs one process per core, and on
# two cores a second intra-op thread only waits for the core the other process holds (tests of
# 7 files, two processes: 89/80 -> 66/62 s, 2-vCPU Xeon, 2026-11-28). Tests that need two ask
# for ``two_threads``.
@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread() -> None:
    import torch

    torch.set_num_threads(1)


# The files whose tests take longest in all (seconds of test time, `--junitxml`, 2-vCPU Xeon,
# 2026-11-29), longest first. They are collected first, and scripts/test.sh hands out whole files
# in that order (`--dist loadfile --no-loadscope-reorder`; xdist would order files by their
# number of tests): each worker takes the next file when it is free, so the two finish together
# (the longest-first rule of the extension's build), and each file's module-scoped fixtures
# (launches, captured models) run once, where `--dist load` ran them in both workers. The whole
# suite, two workers, quiet machine, the same tree: `--dist load` 209 s wall and 338 CPU s,
# `--dist loadfile` 162-183 s and 284-293 CPU s (three runs).
LONGEST_FILES = [
    "test_benchmarks.py",  # 49 s
    "test_distributed.py",  # 42
    "test_tutorials.py",  # 41
    "test_loader_after_thread_pool.py",  # 25
    "test_real_models.py",  # 23
    "test_transformers_models.py",  # 20
    "test_memory.py",  # 14
    "test_worker_lifetime.py",  # 11
    "test_accessor_process.py",  # 10
    "test_timing.py",  # 10
    "test_executor_transparency.py",  # 9
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as before


def pytest_unconfigure() -> None:
    """Leave every object to the process's exit as it is: CPython's last collections at exit
    walk all that torch, transformers and the tests made, 1-1.5 s of CPU in each test process."""
    gc.freeze()
