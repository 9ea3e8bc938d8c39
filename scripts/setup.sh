#!/usr/bin/env bash
# Install what slurmedic and its lab need, idempotently: Debian packages (only those missing,
# without starting their system services), the project's .venv (reinstalled only when
# pyproject.toml changed) and the roots of the lab's other stacks (Debian 13 and unstable, built
# with debootstrap once and cached in /var/cache/slurmedic/stacks). mariadb-server is the lab's
# accounting database (slurmdbd's, for every stack); chromium is for the console's browser
# tests. Run as root on Debian 12.
# Arguments name the stacks to build (default: all of them; `none` for none).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(slurmctld slurmd slurmdbd slurm-client slurmrestd slurm-wlm-jwt-plugin munge
          prometheus prometheus-alertmanager
          prometheus-pushgateway mtail postgresql mariadb-server python3 python3-venv
          debootstrap chromium)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  # The lab runs its own daemons by PID on its own ports: keep apt from starting the
  # packages' system services (a no-op where there is no init system).
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
  fi
  trap '[ "$own_policy" = 1 ] && rm -f "$policy"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.slurmedic-installed
want=$(cat pyproject.toml reporter/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing slurmedic and its progress reporter (reporter/) into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  # In one run, so that slurmedic's dependency on slurmedic-progress is met by the checkout's.
  .venv/bin/python -m pip install -q -e ./reporter -e '.[dev]'
  echo "$want" > "$stamp"
fi
if [ "${1:-}" != none ]; then
  .venv/bin/slurmedic lab build "$@"
fi
echo "setup: ready"
