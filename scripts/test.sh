#!/usr/bin/env bash
# Set up, then run the whole test suite: lint, types, rule and config checks, unit tests and
# lab tests (the lab tests bring up labs of their own on other ports and leave nothing running).
# Arguments go to pytest, e.g. `./scripts/test.sh -m "not lab"` for the unit tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== alert rules"
slurmedic rules check
promtool check rules alert_rules/*.rules.yml
promtool test rules alert_rules/tests/*.test.yml
amtool check-config alert_rules/alertmanager.yml
echo "== ansible-lint (production profile)"
ansible-lint --offline playbooks/ inventory/
echo "== pytest"
pytest "$@"
