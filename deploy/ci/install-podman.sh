#!/usr/bin/env bash
# What deploy/ci/compose-check.sh needs to run containers without a Docker engine, from Debian
# (bookworm): now deploy/system-deps.sh's `compose` list, which this only calls (kept for the
# callers that still name this script). Why the packages beyond those system-deps.sh explains:
# netavark + aardvark-dns, the per-project network and container-to-container DNS by service
# name (measured to work here, so CNI's dnsname plugin is not needed); debootstrap, the stand-in
# base images (deploy/ci/standins/build.sh); iptables, netavark's port publishing; python3-venv,
# the virtualenv podman-compose is pinned into.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/../system-deps.sh" compose
