#!/usr/bin/env bash
# The lowest torch and transformers that setup.py allows, installed and tested: a venv of their own
# (default runs/floors-venv) made by scripts/install.sh with those two pinned to setup.py's floors,
# then the in-process tests (every task, family, AOT package and packing path) in it. Run once per
# floor change (it takes about as long as the unit tests); the result goes in docs/contributing.md.
#
#   bash scripts/check_floors.sh [pytest arguments]   # default: tests/unit
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-runs/floors-venv}"
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
sed -n 's/^ *"\(torch\|transformers\)>=\([0-9.]*\)".*/\1==\2/p' setup.py > "$pins"
[ "$(wc -l < "$pins")" -eq 2 ] || { echo "no torch and transformers floors found in setup.py" >&2; exit 1; }
echo "floors: $(tr '\n' ' ' < "$pins")"
PIP_CONSTRAINT="$pins" TORCH_SPEC="$(grep '^torch==' "$pins")" VENV="$VENV" bash scripts/install.sh
"$VENV/bin/python" -c "import torch, transformers; print('installed: torch', torch.__version__, 'transformers', transformers.__version__)"
"$VENV/bin/pytest" -q -p no:cacheprovider "${@:-tests/unit}"
