#!/usr/bin/env bash
# The checks of the whole test suite that are not pytest: lint, types, the alert rules and the
# Alertmanager config on every stack's Prometheus and Alertmanager, the playbooks against
# ansible-lint's production profile, and with `wheels`, the built wheels from a bare venv
# (scripts/wheel_check.py). scripts/test.sh runs it beside the first lab tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
STACKS=(${SLURMEDIC_TEST_STACKS:?"the stacks to check: run scripts/test.sh, or set SLURMEDIC_TEST_STACKS"})

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
  # slurmedic's notices on each release's routing: a job's own failure to its owner, a hardware
  # one to the operators (tests/unit/test_signals.py holds every kind, with real notice labels).
  for want in "job-owners cause=application" "oncall cause=gpu_hardware"; do
    "${run[@]}" amtool config routes test --config.file=alert_rules/alertmanager.yml \
      --verify.receivers="${want%% *}" notice=slurmedic alertname=SlurmedicEscalation \
      slurm_user=alice "${want#* }" > /dev/null
  done
  # What a site deploys: the shipped files exported with a config of its own (runbooks
  # elsewhere), whose tests pass on its rendering; the example scrape config.
  site=$(mktemp -d)
  sed 's|^  runbook_base: .*|  runbook_base: https://wiki.example.org/slurmedic|' alert_rules/config.yml > "$site/rules-config.yml"
  slurmedic files export "$site/export" --rules-config "$site/rules-config.yml" > /dev/null
  "${run[@]}" promtool test rules "$site"/export/alert_rules/tests/*.test.yml > /dev/null
  "${run[@]}" promtool check config examples/prometheus.yml > /dev/null
  rm -rf "$site"
done
echo "== ansible-lint (production profile)"
ansible-lint --offline playbooks/ inventory/
if [ "${1:-}" = wheels ]; then
  echo "== the wheels, installed into a bare venv outside the repo (and the reporter alone)"
  SLURMEDIC_LAB_STACK="${STACKS[0]}" python scripts/wheel_check.py
fi
