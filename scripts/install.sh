#!/usr/bin/env bash
# Create or reuse the virtual environment, install torch first (a plain `torch` would pull a
# multi-GB CUDA build where a CPU one is wanted), then this package, and make sure Java 17+ is
# there for TorchServe.
#
#   INSTALL          dev (default): this checkout, editable, with the test extra and the manifest
#                    checker's models (what the tests run in); wheel: a wheel built from this
#                    checkout, installed as a user would (not editable, no extras): what
#                    tests/integration/test_embedding_server.py runs
#   DIST             with INSTALL=wheel: where the wheel is built (default dist)
#   TORCH_SPEC       which torch to install first (default torch==2.13.0, the release this project
#                    is tested with; which build comes, CPU or CUDA, is the index's: the script says)
#   TORCH_INDEX_URL  the package index to take torch from (default: pip's own configuration);
#                    PyTorch's wheel index for your CUDA version gives a CUDA build
#   VENV             where the environment goes (default .venv)
#   COMPILE_JOBS     processes that byte-compile the venv after pip (default: the usable cores)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
INSTALL="${INSTALL:-dev}"
DIST="${DIST:-dist}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"

java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ]; then
  install_java="apt-get update -q && apt-get install -y -q openjdk-17-jre-headless"
  if [ "$(id -u)" -ne 0 ]; then
    echo "TorchServe needs Java 17 or newer, and this machine has none. Install it as root, e.g.:" >&2
    echo "  sudo sh -c '$install_java'" >&2
    echo "(or your system's JDK 17+ package), then run this script again." >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "TorchServe needs Java 17 or newer; install your system's JDK 17+ package, then run this again." >&2
    exit 1
  fi
  echo "Java 17 not found: installing openjdk-17-jre-headless" >&2
  bash scripts/apt_install.sh openjdk-17-jre-headless
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# pip byte-compiles what it installs one file at a time: about half of the install's CPU (torch,
# transformers, Ray). The installs below skip that; compile_all does the same work at the end, on
# every core.
pip_install() { "$VENV/bin/python" -m pip install -q --no-compile "$@"; }
compile_all() {
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # torch's py312 test helper is written for later Pythons (pip skips it silently); anything else
  # left uncompiled is said, and its imports still work.
  "$VENV/bin/python" -m compileall -qq -j "${COMPILE_JOBS:-$(nproc)}" -x 'py312_intrinsics\.py$' "$site" ||
    echo "install.sh: compileall left some files of $site uncompiled (imports still work)" >&2
}
if [ -n "$TORCH_INDEX_URL" ]; then
  pip_install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"
else
  pip_install "$TORCH_SPEC"
fi
if [ "$INSTALL" = wheel ]; then
  rm -rf build "$DIST"/ts_compiled_handlers-*.whl   # setuptools' build/ would carry files since removed
  "$VENV/bin/python" -m pip wheel -q --no-deps --wheel-dir "$DIST" .
  pip_install "$DIST"/ts_compiled_handlers-*.whl   # with its dependencies
  # the same version number over an earlier install: pip would keep the old files
  pip_install --force-reinstall --no-deps "$DIST"/ts_compiled_handlers-*.whl
else
  pip_install -e ".[test]"
  # The KServe and Kubernetes API models, read as source by scripts/validate_manifests.py; without
  # their (heavy, server-side) dependencies, which the check does not need.
  pip_install --no-deps kserve==0.21.0 kubernetes==37.0.2
  # LangChain's TEI client, for the TEI tests: 1.2.1, the last release that takes a server's URL as
  # `model` (1.2.2 refuses URLs: langchain-ai/docs#4364). It caps huggingface_hub below the 2.x
  # that transformers brings; its one call, InferenceClient.feature_extraction, works on 2.x.
  pip_install --no-deps langchain-huggingface==1.2.1
fi
compile_all
build=$("$VENV/bin/python" -c 'import torch; print(f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU")')
case "$build" in
  CPU) other="for a CUDA build, TORCH_INDEX_URL=<PyTorch's wheel index for your CUDA version>" ;;
  *) other="for the CPU build, TORCH_INDEX_URL=<PyTorch's CPU wheel index>" ;;
esac
torch_version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')
echo "environment ready: $VENV (torch $torch_version, a $build build: $other; java $(java_major))"
# TorchServe started by `hfserve serve` (and the benchmarks) runs with tcmalloc where it is installed.
tcmalloc=$(HFSERVE_ALLOCATOR=auto LD_PRELOAD='' "$VENV/bin/python" -m ts_compiled_handlers.runtime.allocator)
echo "tcmalloc: ${tcmalloc:-not installed (apt-get install libtcmalloc-minimal4: docs/operations.md#memory-allocator)}"
