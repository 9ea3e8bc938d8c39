#!/usr/bin/env bash
# Set up, then run the whole test suite: lint, types, rule and config checks on every stack's
# Prometheus, Alertmanager and mtail, the built wheels from a bare venv (scripts/wheel_check.py),
# unit and service tests beside the first stack's lab tests, then the other stacks' lab tests
# side by side (each lab test run brings up labs of its own on other ports and leaves nothing
# running).
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
if [ $# -gt 0 ]; then
  echo "== pytest"
  exec pytest "$@"
fi
echo "== the wheels, installed into a bare venv outside the repo (and the reporter alone)"
SLURMEDIC_LAB_STACK="${STACKS[0]}" python scripts/wheel_check.py
logs="$(mktemp -d)"
# The lab tests of one stack, its output kept in $logs/<stack>.log (printed once it is done):
# its own ports (SLURMEDIC_TEST_PORT_BASE, 6000 apart: a run's labs use base..+5000) and its
# own temporary directory. The mtail program's tests (the lab's lines and the corpus of real
# ones) run in the first stack's unit tests, and here on the others.
lab_tests() {
  local stack=$1 i=$2
  (
    export SLURMEDIC_LAB_STACK="$stack" SLURMEDIC_TEST_PORT_BASE=$((27000 - 6000 * i))
    echo "== pytest: lab tests on the $stack stack"
    pytest -p no:cacheprovider --basetemp="$logs/$stack" -m lab &&
      if [ "$i" -gt 0 ]; then
        echo "== pytest: the mtail program on the $stack stack"
        pytest -p no:cacheprovider --basetemp="$logs/$stack-mtail" \
          tests/unit/test_mtail_program.py tests/unit/test_joblog_corpus.py
      fi
  ) >"$logs/$stack.log" 2>&1
}
# Two at a time, as the machine (two cores) carries them: the first stack's lab tests, which
# mostly wait on Slurm's and Prometheus' intervals, beside the unit and service tests, which
# mostly compute; then the other stacks' lab tests side by side.
failed=0
lab_tests "${STACKS[0]}" 0 &
first=$!
echo "== pytest: unit and service tests on the ${STACKS[0]} stack"
SLURMEDIC_LAB_STACK="${STACKS[0]}" pytest -p no:cacheprovider -m "not lab" || failed=1
wait "$first" || failed=1
cat "$logs/${STACKS[0]}.log"
pids=()
i=0
for stack in "${STACKS[@]:1}"; do
  i=$((i + 1))
  lab_tests "$stack" "$i" &
  pids+=($!)
done
i=0
for stack in "${STACKS[@]:1}"; do
  wait "${pids[$i]}" || failed=1
  cat "$logs/$stack.log"
  i=$((i + 1))
done
rm -rf "$logs"
exit $failed
