#!/usr/bin/env bash
# Sets everything up, then runs the main job: the MNIST pipelining tutorial, 2 epochs, pipelined.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python tutorials/pipelining/mnist_pipeline.py --epochs 2 --strategy pipelined "$@"
