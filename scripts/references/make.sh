#!/usr/bin/env bash
# Remake the tests' reference answers of libraries that cannot share the package's venv (their
# pins are older), each in a venv of its own under .references/ (ignored by git):
#   PyLate 1.6 (sentence-transformers 5.3, transformers 5.3) -> tests/data/pylate_colbert.json
#   FlagEmbedding 1.4.2 (transformers 4.57)                   -> tests/data/flag_m3.json
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
if [ ! -x "$REFS/flag/bin/python" ]; then
  python3 -m venv "$REFS/flag"
  # FlagEmbedding's encoders need transformers 4 (it imports modeling_attn_mask_utils, gone in 5);
  # its package imports its training pieces too (peft, ir-datasets, datasets)
  "$REFS/flag/bin/pip" install -q torch==2.13.0
  "$REFS/flag/bin/pip" install -q transformers==4.57.6 datasets==5.0.1 accelerate==1.15.0 peft==0.21.2 \
    ir-datasets==0.6.3 sentencepiece==0.2.3
  "$REFS/flag/bin/pip" install -q --no-deps FlagEmbedding==1.4.2
fi
"$VENV/bin/python" scripts/make_tiny_models.py "$REFS/models" --only colbert m3
"$REFS/pylate/bin/python" scripts/references/pylate_colbert.py "$REFS/models/colbert" tests/data/pylate_colbert.json
"$REFS/flag/bin/python" scripts/references/flag_m3.py "$REFS/models/m3" tests/data/flag_m3.json
echo "wrote tests/data/pylate_colbert.json and tests/data/flag_m3.json"
