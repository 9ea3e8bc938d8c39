#!/usr/bin/env bash
# Set up, then run the whole test suite: lint, types, rule checks, unit tests and lab tests
# (the lab tests bring up their own lab on other ports and leave nothing running).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"
ruff check .
ruff format --check .
echo "== mypy"
mypy
echo "== promtool"
promtool check rules alert_rules/*.rules.yml
shopt -s nullglob
rule_tests=(alert_rules/tests/*.test.yml)
[ ${#rule_tests[@]} -eq 0 ] || promtool test rules "${rule_tests[@]}"
echo "== pytest"
pytest "$@"
