#!/usr/bin/env bash
# Sets everything up, then runs the test suite on every core (pytest-xdist). Long runs marked
# `slow` are left out; `scripts/test.sh --all` runs them too. Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export POPTORCH_SIM_OFFLINE=${POPTORCH_SIM_OFFLINE:-1}
# The project's modules byte-compiled, as Python does by itself where PYTHONDONTWRITEBYTECODE is
# unset: where it is set (as in CI), every test process and every child it starts compiled them
# again, 0.5 of the 3.4 s of `import poptorch`. Five process-heavy test files, one process, in the
# order without-with-with-without: 39.2 and 40.6 -> 35.0 and 33.0 s (2-vCPU Xeon, 2026-11-29).
.venv/bin/python -m compileall -q -j 0 poptorch_sim poptorch popart popdist tests benchmarks \
    tutorials >/dev/null
select=()
if [ "${1:-}" == "--all" ]; then
    shift
    select=(-m "")
fi
# One test process per core the command may use, at least 2 (much of a test's time is spent
# waiting on threads and child processes); POPTORCH_SIM_TEST_WORKERS overrides it. Each process
# has its own SIMD choice cache, and takes whole files, longest first (both in tests/conftest.py).
workers=${POPTORCH_SIM_TEST_WORKERS:-$(( $(nproc) > 2 ? $(nproc) : 2 ))}
.venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile --no-loadscope-reorder ${select[@]+"${select[@]}"} "$@"
