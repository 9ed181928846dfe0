#!/usr/bin/env bash
# apt-get update, then install the named packages (as root). One such call at a time on this
# machine: the test command builds the image (Docker, debootstrap) while it installs (Java), and
# two apt-gets at once would fail on dpkg's lock instead of waiting for it.
#
#   bash scripts/apt_install.sh openjdk-17-jre-headless
set -euo pipefail
exec 8>/tmp/hfserve-apt.lock
flock 8
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
