#!/usr/bin/env bash
# Remake the tests' reference answers of libraries that cannot share the package's venv (their
# pins are older), each in a venv of its own under .references/ (ignored by git):
#   PyLate 1.6 (sentence-transformers 5.3, transformers 5.3) -> tests/data/pylate_colbert.json
# Run from the repository root after scripts/install.sh; it takes a few minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${VENV:-.venv}"
REFS=.references
mkdir -p "$REFS"
if [ ! -x "$REFS/pylate/bin/python" ]; then
  python3 -m venv "$REFS/pylate"
  # torch first (the CPU build, as scripts/install.sh pins it), then PyLate without its index
  # packages (fast-plaid, fastkmeans: they pin another torch, and encoding never imports them)
  "$REFS/pylate/bin/pip" install -q torch==2.13.0
  "$REFS/pylate/bin/pip" install -q sentence-transformers==5.3.0 transformers==5.3.0 datasets ujson
  "$REFS/pylate/bin/pip" install -q --no-deps pylate==1.6.0
fi
"$VENV/bin/python" scripts/make_tiny_models.py "$REFS/models" --only colbert
"$REFS/pylate/bin/python" scripts/references/pylate_colbert.py "$REFS/models/colbert" tests/data/pylate_colbert.json
echo "wrote tests/data/pylate_colbert.json"
