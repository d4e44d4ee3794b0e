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

# The values of one option in pip's configuration ($pip_config: its files and PIP_* variables),
# one per line: uv reads neither, so they are handed to it.
pip_option() {
    sed -n "s/^[^ ]*\.$1='\(.*\)'\$/\1/p" <<<"$pip_config" | tr ' ' '\n' | awk 'NF && !seen[$0]++'
}

# uv unpacks and links the wheels in parallel where pip takes one file at a time: torch's CUDA
# build and its libraries are about 5.5 GB, which pip installed in 56 s on a quiet machine and
# 150 s beside other jobs, and uv in 19 s beside the same jobs with an empty cache (2-vCPU Xeon,
# 2026-11-28). It resolves as pip does: every index pip is configured with, the best match
# across them, pip's constraints. Where uv cannot be installed, pip does the work.
install_requirements() {
    if .venv/bin/python -m pip install -q uv==0.13.9; then
        local pip_config args=(--python .venv/bin/python --index-strategy unsafe-best-match)
        pip_config=$(.venv/bin/python -m pip config list 2>/dev/null)
        local option value
        # uv's options of these names take what pip's do.
        for option in index-url extra-index-url find-links constraint; do
            for value in $(pip_option "$option"); do args+=("--$option" "$value"); done
        done
        # Byte-compiled as pip does by default (uv only when asked), on every core: about 45
        # CPU seconds for the 11,000 files of torch, transformers and the rest. Where
        # PYTHONDONTWRITEBYTECODE is set (as in many containers), Python would otherwise compile
        # torch's modules again in every process that imports it: the suite took 260 s on a
        # fresh clone without the bytecode and 143 s with it (2-vCPU Xeon, 2026-11-29).
        SSL_CERT_FILE=${SSL_CERT_FILE:-$(pip_option cert)} \
            .venv/bin/uv pip install -q --compile-bytecode "${args[@]}" -r requirements-dev.txt
    else
        .venv/bin/python -m pip install -q -r requirements-dev.txt
    fi
}
# "bytecode": a venv whose requirements were installed without it installs them once more.
step requirements "$(fingerprint requirements.txt requirements-dev.txt) bytecode" install_requirements
# What the package and the extension are built against: requirements.txt pins torch. The test
# tools of requirements-dev.txt are not part of it, so adding one rebuilds nothing.
deps=$(fingerprint requirements.txt)

# The package itself, editable, without the extension (built next, in place).
install_package() {
    POPTORCH_SIM_SKIP_EXT=1 .venv/bin/python -m pip install -q --no-build-isolation --no-deps -e .
}
step package "$(fingerprint setup.py pyproject.toml) $deps" install_package

# The extension: against the torch installed above, at most MAX_JOBS compilers at once (ninja's
# default otherwise). A missing library forces the step. A library built before from the same
# sources, torch, compiler and Python (in this checkout or another one on this machine) is
# copied from the build cache instead of compiled again: a fresh clone of an unchanged tree
# builds nothing. POPTORCH_SIM_BUILD_CACHE=0 turns the cache off.
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/poptorch_sim/extensions
build_extension() {
    local cached=$cache_root/$1
    if [ "${POPTORCH_SIM_BUILD_CACHE:-1}" != 0 ] && compgen -G "$cached/_C*.so" >/dev/null; then
        cp "$cached"/_C*.so poptorch_sim/
        echo "setup: extension copied from $cached"
        return
    fi
    .venv/bin/python setup.py -q build_ext --inplace
    if [ "${POPTORCH_SIM_BUILD_CACHE:-1}" != 0 ]; then
        mkdir -p "$cached.tmp.$$" && cp poptorch_sim/_C*.so "$cached.tmp.$$"/ &&
            mv -T "$cached.tmp.$$" "$cached" 2>/dev/null || rm -rf "$cached.tmp.$$"
    fi
}
compgen -G "poptorch_sim/_C*.so" >/dev/null || rm -f "$stamps/extension"
# Every file under csrc/ (one folder per op family), in a fixed order, and what else the library
# depends on: the compiler, the Python, whether a CUDA build was asked for or is possible, and
# whether the 8-lane test hook is (the CPU's AVX-512; see [Note: the 8-lane hook] in setup.py).
toolchain=$( (c++ --version | head -1; .venv/bin/python -VV; uname -m
    echo "${POPTORCH_SIM_BUILD_CUDA:-}"; compgen -G "/dev/nvidia[0-9]*" || true
    echo "${POPTORCH_SIM_BUILD_8_LANES:-}"; { grep -ow 'avx512[a-z]*' /proc/cpuinfo 2>/dev/null || true; } | sort -u) |
    sha256sum)
print=$(fingerprint setup.py $(find csrc -type f | LC_ALL=C sort) | cut -c1-32)-${toolchain:0:16}-${deps:0:16}
step extension "$print" build_extension "$print"
