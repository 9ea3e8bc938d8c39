#!/usr/bin/env bash
# Set up, then run the whole test suite: lint, types, rule and config checks on every stack's
# Prometheus, Alertmanager and mtail, the built wheels from a bare venv (scripts/wheel_check.py),
# unit tests, and the lab tests on every stack (each lab test run brings up labs of its own on
# other ports and leaves nothing running).
#
# With arguments, they go to one pytest run on the default stack instead, e.g.
# `./scripts/test.sh -m "not lab"` for the unit tests alone; SLURMEDIC_LAB_STACK picks the stack.
# SLURMEDIC_TEST_STACKS names the stacks whose lab tests a full run runs (default: all three).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
STACKS=(${SLURMEDIC_TEST_STACKS:-trixie bookworm sid})

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== alert rules"
slurmedic rules check
for stack in "${STACKS[@]}"; do
  run=(slurmedic lab exec "$stack")
  echo "-- $stack: $("${run[@]}" promtool --version | head -1)"
  "${run[@]}" promtool check rules alert_rules/*.rules.yml
  "${run[@]}" promtool test rules alert_rules/tests/*.test.yml
  echo "-- $stack: $("${run[@]}" amtool --version 2>&1 | head -1)"
  "${run[@]}" amtool check-config alert_rules/alertmanager.yml
done
echo "== ansible-lint (production profile)"
ansible-lint --offline playbooks/ inventory/
if [ $# -gt 0 ]; then
  echo "== pytest"
  exec pytest "$@"
fi
echo "== the wheels, installed into a bare venv outside the repo (and the reporter alone)"
SLURMEDIC_LAB_STACK="${STACKS[0]}" python scripts/wheel_check.py
echo "== pytest"
# The whole suite on the first stack; the lab tests (real Slurm, Prometheus, Alertmanager,
# mtail) and the mtail program's tests (the lab's lines and the corpus of real ones) on the others.
SLURMEDIC_LAB_STACK="${STACKS[0]}" pytest
for stack in "${STACKS[@]:1}"; do
  echo "== pytest: lab tests and the mtail program on the $stack stack"
  SLURMEDIC_LAB_STACK="$stack" pytest -m lab
  SLURMEDIC_LAB_STACK="$stack" pytest tests/unit/test_mtail_program.py tests/unit/test_joblog_corpus.py
done
