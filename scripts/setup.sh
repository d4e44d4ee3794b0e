#!/usr/bin/env bash
# Creates .venv (if missing), installs the requirements and poptorch_sim into it and builds the
# C++ kernels in place. Each step runs only when its inputs changed since it last succeeded
# (fingerprints in .venv/.setup/): a second run on an unchanged tree takes well under a second.
# The C++ objects stay in build/, where ninja recompiles only the files that changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamps=.venv/.setup
mkdir -p "$stamps"

# The fingerprint of the named files' names and contents.
fingerprint() {
    for file in "$@"; do
        echo "$file"
        cat "$file"
    done | sha256sum | cut -d' ' -f1
}

# Runs the step named $1 (the command after the fingerprint $2) unless it last succeeded with
# the same fingerprint.
step() {
    local name=$1 print=$2
    shift 2
    if [ "$(cat "$stamps/$name" 2>/dev/null)" == "$print" ]; then
        return
    fi
    local start=$SECONDS
    "$@"
    echo "$print" >"$stamps/$name"
    echo "setup: $name done in $((SECONDS - start)) s"
}

install_requirements() {
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r requirements-dev.txt
}
deps=$(fingerprint requirements.txt requirements-dev.txt)
step requirements "$deps" install_requirements

# The package itself, editable, without the extension (built next, in place).
install_package() {
    POPTORCH_SIM_SKIP_EXT=1 .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
}
step package "$(fingerprint setup.py pyproject.toml) $deps" install_package

# The extension: against the torch installed above, at most MAX_JOBS compilers at once (ninja's
# default otherwise). A missing library forces the step.
build_extension() {
    .venv/bin/python setup.py -q build_ext --inplace
}
compgen -G "poptorch_sim/_C*.so" >/dev/null || rm -f "$stamps/extension"
# Every file under csrc/ (one folder per op family), in a fixed order.
step extension "$(fingerprint setup.py $(find csrc -type f | LC_ALL=C sort)) $deps" build_extension
