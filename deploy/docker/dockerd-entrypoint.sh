#!/usr/bin/env bash
# The image's entry point, with TorchServe's image convention: `serve` (the default command, also
# taken when the arguments start with a flag) starts TorchServe with the home folder's
# config.properties and model store, the arguments after it passed on; any other command runs as
# given, so KServe's TorchServe runtime can pass its own `torchserve --start ...`. TorchServe runs
# in the foreground, and a SIGTERM or SIGINT to the container (docker stop, a pod's termination)
# stops it with `torchserve --stop`, so the frontend shuts its workers down instead of being killed.
# TorchServe runs in the home folder whatever the working directory (`docker run -w`): it writes its
# key_file.json there, where `hfserve register/describe/health ...` (HFSERVE_WORKDIR) read it with
# the config's ports. Other commands run where they are started.
set -euo pipefail
HOME_DIR="${MODEL_SERVER_HOME:-/home/model-server}"
# tcmalloc for every process started here (the workers inherit the frontend's environment); a
# process picks its allocator when it starts, so it is set now (handlers/runtime/allocator.py).
preload=$(python3 -m ts_compiled_handlers.runtime.allocator || true)  # none found: glibc's, as before
[ -z "$preload" ] || export LD_PRELOAD="$preload"
if [ $# -eq 0 ] || [ "$1" = serve ] || [[ "$1" == -* ]]; then
  [ "${1:-}" = serve ] && shift
  set -- torchserve --start --ncs --ts-config "$HOME_DIR/config.properties" --model-store "$HOME_DIR/model-store" "$@"
fi
if [ "$1" != torchserve ] || [[ " $* " != *" --start "* ]]; then
  exec "$@"
fi
[[ " $* " == *" --foreground "* ]] || set -- "$@" --foreground
cd "$HOME_DIR"
"$@" &
server=$!
trap 'torchserve --stop || kill -TERM "$server"' TERM INT
# `wait` returns early when a trapped signal arrives: wait again for TorchServe itself to end.
wait "$server" || true
wait "$server"
