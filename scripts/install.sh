#!/usr/bin/env bash
# Create or reuse the virtual environment, install the pinned CPU torch first (a plain `torch`
# would pull a multi-GB CUDA build), then this package with its test extra, and make sure Java 17+
# is there for TorchServe.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q -e ".[test]"
# The KServe and Kubernetes API models, read as source by scripts/validate_manifests.py; without
# their (heavy, server-side) dependencies, which the check does not need.
"$VENV/bin/python" -m pip install -q --no-deps kserve==0.21.0 kubernetes==37.0.2

java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ]; then
  echo "Java 17 not found: installing openjdk-17-jre-headless" >&2
  apt-get update -q && apt-get install -y -q openjdk-17-jre-headless
fi
echo "environment ready: $VENV (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), java $(java_major))"
