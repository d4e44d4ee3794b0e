#!/usr/bin/env bash
# Compatibility run of Graphcore's model garden on poptorch_sim.
#
#   benchmarks/model_garden/run.sh EXAMPLES_CHECKOUT [--apps cnns,bert,gpt2,vit,clip]
#                                  [--work DIR] [--test-timeout S] [--train-timeout S]
#                                  [--clean]
#
# EXAMPLES_CHECKOUT is your own clone of github.com/graphcore/examples (nothing of it is in
# this repository). Each app gets a scratch virtual environment under --work whose
# site-packages points at this project's environment (.pth), so the project's torch is used
# untouched; the app's pinned requirements are installed there where they install on this
# Python (torch, torchvision, poptorch and pytest lines are left out). The app's tests and its
# synthetic/generated-data training command then run, and a table says what passed and, for
# each failure, whose it is (poptorch_sim, environment, app). See garden.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PY:-$root/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"
exec "$py" "$here/garden.py" --project "$root" "$@"
