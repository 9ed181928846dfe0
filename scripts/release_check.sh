#!/usr/bin/env bash
# The long runs the test command leaves out, run before a release and whenever a benchmark or the
# load test changes: the smoke runs of every benchmark and of the load test (the `release` marker,
# tests/integration/test_benchmark_scripts.py: about six minutes on 2 cores), then a fuzz run of
# 2,000 generated requests per task (scripts/test.sh runs 200). Installs as the test command does,
# then the small-shapes benchmark's anchors (`.[anchors]`: ONNX Runtime, OpenVINO, NNCF), which the
# test command leaves out: OpenVINO registers a torch.compile backend that torch imports in every
# process that compiles, each TorchServe worker included.
#
#   FUZZ_REQUESTS   generated requests per task in the fuzz run (default 2000; 0 skips it)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${VENV:-.venv}"
"$VENV/bin/python" -m pip install -q -e ".[anchors]"
FUZZ_REQUESTS="${FUZZ_REQUESTS:-2000}"
"$VENV/bin/pytest" -q --release -m release "$@"
if [ "$FUZZ_REQUESTS" -gt 0 ]; then
  "$VENV/bin/pytest" -q tests/integration/test_fuzz_server.py --fuzz-requests "$FUZZ_REQUESTS"
fi
