#!/usr/bin/env bash
# Set up, then run the main job on embedded defaults: bring the lab up (a real 8-node Slurm
# cluster and monitoring stack on loopback), run a training job, inject a GPU fault and follow
# it until it arrives as an alert. The lab keeps running; `.venv/bin/slurmedic lab down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/slurmedic lab demo "$@"
