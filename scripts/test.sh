#!/usr/bin/env bash
# Sets everything up, then runs the test suite (long runs marked `slow` are left out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export POPTORCH_SIM_OFFLINE=${POPTORCH_SIM_OFFLINE:-1}
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
