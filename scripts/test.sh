#!/usr/bin/env bash
# The test command: install from scratch (or reuse the venv), lint, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${VENV:-.venv}"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/python" -m pytest -q "$@"
