#!/usr/bin/env bash
# Build the image ts-compiled-handlers:latest (the Dockerfile) wherever Docker runs, including
# machines that reach only package registries.
#
#   bash scripts/build_image.sh            # then: docker images ts-compiled-handlers
#
# - Docker: a client with BuildKit (Docker 20.10-22 have it built in; newer ones need buildx).
#   Where no daemon answers and this runs as root, it installs Debian's docker.io if needed and
#   starts dockerd on the default socket, left running for the next build (it says so).
# - The base: BASE_IMAGE if set; else python:3.11-slim-bookworm if it can be pulled (or is here);
#   else a local Debian 12 base, hfserve-base:bookworm, made once with debootstrap from the apt
#   mirror this host uses (python3 and venv included) and kept for later builds.
# - Packages come the way this host's pip gets them (deploy/docker/pip_config.py): its
#   configuration and CA certificates as BuildKit secrets, never kept in a layer; its local wheel
#   folders through the build context (deploy/docker/wheels/, emptied afterwards).
#
#   IMAGE            the tag (default ts-compiled-handlers:latest)
#   BASE_IMAGE       the base to build on (default: as above)
#   TORCH_SPEC       torch to install (default torch==2.13.0)
#   TORCH_INDEX_URL  where torch comes from (default: pip's configuration, as scripts/install.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
# One build at a time per checkout: the test command starts one in the background, and the image
# test asks for one too; the second waits for the first, then finds the image up to date.
exec 9<scripts/build_image.sh
if command -v flock >/dev/null; then flock 9; fi
IMAGE="${IMAGE:-ts-compiled-handlers:latest}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"
PUBLIC_BASE=python:3.11-slim-bookworm
LOCAL_BASE=hfserve-base:bookworm

say() { echo "build_image: $*" >&2; }
as_root() {
  if [ "$(id -u)" -ne 0 ]; then
    say "$1, and only root can fix that here: $2"
    exit 1
  fi
}

# A docker client whose `build` has BuildKit (--secret): Debian's 20.10 has it built in; 23 and
# newer hand BuildKit to the buildx plugin.
client_major() { "$1" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1 || true; }
buildkit_client() {
  local candidate major
  for candidate in $(type -ap docker) /usr/bin/docker; do
    [ -x "$candidate" ] || continue
    major=$(client_major "$candidate")
    if [[ "$major" =~ ^[0-9]+$ ]] && { [ "$major" -lt 23 ] || "$candidate" buildx version >/dev/null 2>&1; }; then
      echo "$candidate"
      return
    fi
  done
  return 1
}

DOCKER=$(buildkit_client || true)
if [ -z "$DOCKER" ]; then
  as_root "no docker client with BuildKit (buildx) was found" "install docker.io (Debian) or docker-buildx-plugin"
  say "installing Debian's docker.io (a docker client with BuildKit built in, and dockerd)"
  bash scripts/apt_install.sh docker.io >&2
  DOCKER=/usr/bin/docker
fi
if ! "$DOCKER" info >/dev/null 2>&1; then
  as_root "no Docker daemon answers" "start dockerd (or: sudo bash $0)"
  if ! command -v dockerd >/dev/null; then
    bash scripts/apt_install.sh docker.io >&2
  fi
  say "starting dockerd on the default socket (log: /var/log/hfserve-dockerd.log); it stays running for later builds"
  nohup dockerd >/var/log/hfserve-dockerd.log 2>&1 9<&- &  # without the build lock: it outlives this build
  for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
  "$DOCKER" info >/dev/null || { say "dockerd did not start: see /var/log/hfserve-dockerd.log"; exit 1; }
fi

# The apt mirror this host uses (its first Debian source), for the local base.
host_mirror() {
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -o -E 'https?://[^ ]+/debian/?( |$)' | head -1 | tr -d ' ' | sed 's:/$::' || true
}

local_base() {
  if "$DOCKER" image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    say "using the local base $LOCAL_BASE made earlier"
    return
  fi
  as_root "the base image cannot be pulled" "set BASE_IMAGE to a Debian 12 image with python3 and venv"
  command -v debootstrap >/dev/null || bash scripts/apt_install.sh debootstrap >&2
  local mirror rootfs
  mirror=$(host_mirror)
  mirror="${mirror:-http://deb.debian.org/debian}"
  rootfs=$(mktemp -d)
  say "making $LOCAL_BASE with debootstrap from $mirror (once; about a minute)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" >&2
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$mirror" "$mirror" "$mirror" >"$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "$DOCKER" import - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs"
}

if [ -z "${BASE_IMAGE:-}" ]; then
  if "$DOCKER" image inspect "$PUBLIC_BASE" >/dev/null 2>&1 || "$DOCKER" pull -q "$PUBLIC_BASE" >/dev/null 2>&1; then
    BASE_IMAGE=$PUBLIC_BASE
  else
    say "$PUBLIC_BASE cannot be pulled from here"
    local_base
    BASE_IMAGE=$LOCAL_BASE
  fi
fi

secrets=$(mktemp -d)
wheels=deploy/docker/wheels
cleanup() { rm -rf "$secrets"; find "$wheels" -name '*.whl' -delete; }
trap cleanup EXIT
cert=$(python3 deploy/docker/pip_config.py "$secrets/pip.conf" "$wheels")
build=(build)
[ "$(client_major "$DOCKER")" -lt 23 ] || build=(buildx build --load)
secret_args=(--secret "id=pip.conf,src=$secrets/pip.conf")
[ -z "$cert" ] || secret_args+=(--secret "id=ca-certificates,src=$cert")
say "building $IMAGE on $BASE_IMAGE"
DOCKER_BUILDKIT=1 "$DOCKER" "${build[@]}" "${secret_args[@]}" --progress plain \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TORCH_SPEC=$TORCH_SPEC" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" \
  -t "$IMAGE" .
# The image this tag named before, if any, untagged now: removed (only ours, by the Dockerfile's label).
"$DOCKER" image prune -f --filter label=org.opencontainers.image.title=ts-compiled-handlers >/dev/null
say "built $IMAGE: $("$DOCKER" image inspect "$IMAGE" --format '{{.Size}}' | awk '{printf "%.1f GB", $1 / 1e9}')"
