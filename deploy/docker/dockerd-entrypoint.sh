#!/usr/bin/env bash
# The image's entry point, with TorchServe's image convention: `serve` (the default command) starts
# TorchServe with the home folder's config.properties and model store; any other command runs as
# given, so KServe's TorchServe runtime can pass its own `torchserve --start ...`. TorchServe runs
# in the foreground in place of this script: the container lives as long as it does and gets its
# signals.
set -euo pipefail
HOME_DIR="${MODEL_SERVER_HOME:-/home/model-server}"
if [ "${1:-serve}" = serve ]; then
  shift || true
  set -- torchserve --start --ncs --ts-config "$HOME_DIR/config.properties" --model-store "$HOME_DIR/model-store" "$@"
fi
if [ "$1" = torchserve ] && [[ " $* " == *" --start "* ]] && [[ " $* " != *" --foreground "* ]]; then
  set -- "$@" --foreground
fi
exec "$@"
