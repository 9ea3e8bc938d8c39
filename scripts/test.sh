#!/usr/bin/env bash
# Set up, then run the whole test suite: the checks (scripts/checks.sh: lint, types, rule and
# config checks on every stack's Prometheus, Alertmanager and mtail, the built wheels from a bare
# venv), the unit and service tests and each stack's lab tests (in two halves), two jobs at a
# time (each lab test run brings up labs of its own on other ports and leaves nothing running).
#
# With arguments, they go to one pytest run on the default stack instead, e.g.
# `./scripts/test.sh -m "not lab"` for the unit tests alone; SLURMEDIC_LAB_STACK picks the stack.
# SLURMEDIC_TEST_STACKS names the stacks whose lab tests a full run runs (default: all three).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# The stacks a full run tests (scripts/checks.sh reads them too).
export SLURMEDIC_TEST_STACKS="${SLURMEDIC_TEST_STACKS:-trixie bookworm sid}"
STACKS=($SLURMEDIC_TEST_STACKS)

if [ $# -gt 0 ]; then
  ./scripts/checks.sh
  echo "== pytest"
  exec pytest "$@"
fi
logs="$(mktemp -d)"
# The lab test files in two halves of about equal time: each stack's lab tests run as two jobs
# (the first half's files, then every other lab test file), so that the jobs pack onto the two
# cores with no core idle while one long stack finishes.
LAB_HALF=(
  tests/lab/test_decisions.py tests/lab/test_replicas.py tests/lab/test_repairs.py
  tests/lab/test_decisions_at_scale.py tests/lab/test_console_browser.py
  tests/lab/test_backtest.py tests/lab/test_lifecycle.py tests/lab/test_deploy.py
  tests/lab/test_shards.py tests/lab/test_rest_commands.py
)
# The remediation lab tests again with slurmedic reaching Slurm through slurmrestd alone
# (SLURMEDIC_LAB_SLURM=rest), on the stack whose REST API can requeue (26.05's v0.0.45; the
# others' limits are tests/lab/test_rest_commands.py's): those of what Slurm does (not marked
# one_stack).
REST_STACK=sid
REST_LAB=(tests/lab/test_remediation.py tests/lab/test_remediation_failures.py)
# One part of a stack's lab tests (1: LAB_HALF, 2: the rest, rest: REST_LAB over REST), on its
# own ports (SLURMEDIC_TEST_PORT_BASE, 3000 apart: a run's labs use base..+2930) and in its own
# temporary directory. The mtail program's tests (the lab's lines and the corpus of real ones)
# run in the first stack's unit tests, and here with the other stacks' second halves.
lab_tests() {
  local stack=$1 half=$2 i=$3 files=() marks=lab
  # The tests of slurmedic's own workings, not of what Slurm or Prometheus do (marker
  # one_stack), on the first stack only.
  if [ "$stack" != "${STACKS[0]}" ]; then marks="lab and not one_stack"; fi
  case $half in
    1) files=("${LAB_HALF[@]}") ;;
    2) files=("${LAB_HALF[@]/#/--ignore=}") ;;
    rest) files=("${REST_LAB[@]}") marks="lab and not one_stack" && export SLURMEDIC_LAB_SLURM=rest ;;
  esac
  export SLURMEDIC_LAB_STACK="$stack" SLURMEDIC_TEST_PORT_BASE=$((27000 - 3000 * i))
  echo "== pytest: lab tests on the $stack stack, part $half"
  pytest -p no:cacheprovider --basetemp="$logs/$stack-$half" -m "$marks" "${files[@]}" || return 1
  if [ "$half" = 2 ] && [ "$stack" != "${STACKS[0]}" ]; then
    echo "== pytest: the mtail program on the $stack stack"
    pytest -p no:cacheprovider --basetemp="$logs/$stack-mtail" \
      tests/unit/test_mtail_program.py tests/unit/test_joblog_corpus.py
  fi
}
unit_tests() {
  echo "== pytest: unit and service tests on the ${STACKS[0]} stack"
  SLURMEDIC_LAB_STACK="${STACKS[0]}" pytest -p no:cacheprovider -m "not lab"
}
# The jobs, two at a time as the machine (two cores) carries them, each next one as soon as
# one ends: the checks (a few minutes) beside the first lab job, then the other lab jobs (15 to
# 20 min each), the unit and service tests (14 min, mostly computing), and the shortest, the
# run over slurmrestd, last, so that the two cores finish together. Each job's output is kept
# in $logs/<job>.log and printed once all are done, with its time.
names=(checks)
commands=("./scripts/checks.sh wheels")
i=0
for stack in "${STACKS[@]}"; do
  for half in 1 2; do
    names+=("$stack-$half")
    commands+=("lab_tests $stack $half $i")
    i=$((i + 1))
  done
done
names+=(unit)
commands+=(unit_tests)
for stack in "${STACKS[@]}"; do
  if [ "$stack" = "$REST_STACK" ]; then
    names+=("$stack-rest")
    commands+=("lab_tests $stack rest $i")
  fi
done
run_job() {
  local name=$1 started=$SECONDS rc=0
  shift
  ("$@") >"$logs/$name.log" 2>&1 || rc=$?
  echo "== $name: exit $rc after $((SECONDS - started)) s" >>"$logs/$name.log"
  echo "$rc" >"$logs/$name.rc"
}
for j in "${!names[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || true; done
  echo "== started ${names[$j]} at $SECONDS s"
  run_job "${names[$j]}" ${commands[$j]} &
done
wait
failed=0
for name in "${names[@]}"; do
  cat "$logs/$name.log"
  [ "$(cat "$logs/$name.rc")" = 0 ] || failed=1
done
rm -rf "$logs"
exit $failed
