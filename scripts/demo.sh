#!/usr/bin/env bash
# The demo: build the MiniLM .mar, start TorchServe, register it, send requests, print answers
# and latencies, stop TorchServe.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${VENV:-.venv}/bin/python" scripts/demo.py "$@"
