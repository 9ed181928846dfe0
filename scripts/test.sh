#!/usr/bin/env bash
# The test command: install from scratch (or reuse the venv), lint, then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${VENV:-.venv}"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# pytest's own command, not `python -m pytest`: the repository's root stays off sys.path, so the
# tests import the package as a user does, by its name (a stray `import handlers` fails here).
"$VENV/bin/pytest" -q "$@"
