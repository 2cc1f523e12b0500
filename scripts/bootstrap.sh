#!/usr/bin/env bash
# Installs everything qim needs on a fresh machine, and does nothing that is already done:
# Debian's redis-server (and Java/Maven if missing), the virtualenv with pinned Python packages,
# the Kafka broker jars from Maven Central, Node.js with the JS SDK's packages (npm ci against the
# committed package-lock.json, then its tsc build) and Debian's chromium for the browser tests.
# Called by scripts/run and scripts/test.
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

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "bootstrap: installing Node.js and npm (Debian)"
  apt_install nodejs npm
fi
if ! [ -x /usr/bin/chromium ]; then
  echo "bootstrap: installing chromium (Debian; the browser tests drive it headless)"
  apt_install chromium
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

js_stamp=sdk/js/node_modules/.qim-installed
if [ ! -f "$js_stamp" ] || [ sdk/js/package-lock.json -nt "$js_stamp" ]; then
  echo "bootstrap: npm ci in sdk/js"
  (cd sdk/js && npm ci --no-audit --no-fund --loglevel=error)
  touch "$js_stamp"
fi
if [ ! -f sdk/js/dist/index.js ] || [ -n "$(find sdk/js/src sdk/js/tsconfig.json -newer sdk/js/dist/index.js 2>/dev/null | head -1)" ]; then
  echo "bootstrap: building the JS SDK (tsc)"
  (cd sdk/js && npm run --silent build)
fi
