#!/usr/bin/env bash
# Set up, then run the main job on embedded defaults: bring the lab up (a real 8-node Slurm
# cluster and monitoring stack on loopback), run a training job, inject a GPU fault and follow
# it to an alert, slurmedic's recommendation (monitor mode: its dry-run commands, Slurm
# untouched) and the node's diagnostics. The lab keeps running; `.venv/bin/slurmedic lab down`
# stops it. Running it again starts from healthy GPUs and free nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh none   # `lab demo` builds the stack it runs (first time only)
exec .venv/bin/slurmedic lab demo "$@"
