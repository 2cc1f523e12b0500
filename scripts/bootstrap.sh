#!/usr/bin/env bash
# Installs everything qim needs on a fresh machine, and does nothing that is already done:
# Debian's redis-server (and Java/Maven if missing), the virtualenv with pinned Python packages,
# and the Kafka broker jars from Maven Central. Called by scripts/run and scripts/test.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null 2>&1; then
  echo "bootstrap: installing redis-server (Debian)"
  apt_install redis-server
  # Debian's package may start a system Redis on 6379; qim runs its own on other ports.
  (as_root service redis-server stop >/dev/null 2>&1 || true)
fi
if ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: installing a Java runtime (Debian)"
  apt_install openjdk-17-jre-headless
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "bootstrap: installing Maven (Debian)"
  apt_install maven
fi

PY="${QIM_PYTHON:-python3.11}"
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "bootstrap: $PY is required (Python 3.11)" >&2
  exit 1
fi
stamp=.venv/.qim-installed
if [ ! -x .venv/bin/python ] || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
   || [ constraints.txt -nt "$stamp" ]; then
  echo "bootstrap: creating .venv and installing pinned Python packages"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
  touch "$stamp"
fi

.venv/bin/python -c 'from qim.devstack.kafka import ensure_jars; print("bootstrap: Kafka jars in", ensure_jars())'
