#!/usr/bin/env bash
# The test command: install from scratch (or reuse the venv), lint, then run every test.
#
# With no arguments the suite's two halves run side by side, for a 2-core machine's sake:
# - tests/integration in one pytest process at normal priority: its servers' time limits assume
#   they get the CPU whenever they ask for it;
# - tests/unit on two pytest-xdist workers at the lowest priority (nice 19): they take a core only
#   while the servers wait (on Java, Ray, Docker, sockets, restarts: about a third of their time),
#   and both cores once the servers are done. Their output follows the servers'.
# Both share one inductor cache. Where Docker can run, the image of test_image.py starts building
# first, beside the install (below); that test finds it built, or builds it again and says why it
# failed. With arguments, one plain pytest run takes them (`bash scripts/test.sh tests/unit -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
scratch=$(mktemp -d)
# On any exit (^C included) no niced pytest or image build is left behind. The script's own status
# is kept: under `set -e` a failing command here (kill of a job that already ended) would replace it.
stop_background() {
  local status=$?
  for job in $(jobs -p); do
    pkill -P "$job" 2>/dev/null || true  # its children first: a shell's do not die with it
    kill "$job" 2>/dev/null || true
  done
  rm -rf "$scratch"
  exit "$status"
}
trap stop_background EXIT
# The image builds from the start: the install keeps one core busy (pip; both for its last half
# minute, compiling the venv), and a fresh machine's image build (a Debian base, Java, torch, the
# dependencies) takes the other instead of the servers' CPU later. The two scripts' apt-get calls
# wait for each other (scripts/apt_install.sh).
if [ $# -eq 0 ] && { [ "$(id -u)" -eq 0 ] || docker info >/dev/null 2>&1; }; then
  bash scripts/build_image.sh >"$scratch/image.log" 2>&1 &
fi
bash scripts/install.sh
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# pytest's own command, not `python -m pytest`: the repository's root stays off sys.path, so the
# tests import the package as a user does, by its name (a stray `import handlers` fails here).
if [ $# -gt 0 ]; then
  "$VENV/bin/pytest" -q "$@"
  exit
fi
export TEST_INDUCTOR_CACHE="${TEST_INDUCTOR_CACHE:-$scratch/inductor-cache}"
# Inductor compiles in its own process instead of a pool of two that each import torch, started
# anew by each of the run's many compiles: with every core taken by the two halves, the pool only
# cost CPU (three compile-heavy test files: 105 s against 114 s). Read when torch is imported.
export TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-1}"
nice -n 19 "$VENV/bin/pytest" -q -n 2 tests/unit >"$scratch/unit.log" 2>&1 &
unit_tests=$!
integration=0
"$VENV/bin/pytest" -q tests/integration || integration=$?
unit=0
wait "$unit_tests" || unit=$?
echo "--- tests/unit (beside the servers, nice 19, two workers)"
cat "$scratch/unit.log"
[ "$integration" -eq 0 ] && [ "$unit" -eq 0 ]
