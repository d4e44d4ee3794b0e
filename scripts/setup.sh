#!/usr/bin/env bash
# Creates .venv (if missing) and installs poptorch_sim with its C++ kernels into it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-dev.txt
# --no-build-isolation: the C++ extension builds against the torch installed above.
start=$(date +%s)
.venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
echo "setup: poptorch_sim installed (build $(( $(date +%s) - start )) s)"
