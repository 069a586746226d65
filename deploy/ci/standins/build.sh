#!/usr/bin/env bash
# Stand-ins for the public base images deploy/Dockerfile and deploy/docker-compose.yml name,
# for machines whose container engine cannot reach a registry. For each image: nothing when
# the tag is already in the engine's store (a cached stand-in, or the real image); else a
# pull; only when that fails, a build from Debian bookworm (debootstrap --variant=minbase, then
# the *.Containerfile beside this script), tagged with exactly the name the project uses, so
# the project's own Dockerfile and compose file run unchanged. These images are a cache: the
# CI script never removes them (remove them with `<engine> rmi` to rebuild).
#
#   deploy/ci/standins/build.sh [podman|docker]     (default: $CONTAINER_ENGINE, else podman)
#
# Needs root for debootstrap (only when the Debian base must be made). Environment:
# DEBIAN_MIRROR (http://deb.debian.org/debian), LUMASTRA_CI_PULL_TIMEOUT_S (60),
# LUMASTRA_CI_NO_PULL=1 to build without trying a pull first.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
engine="${1:-${CONTAINER_ENGINE:-podman}}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
pull_timeout="${LUMASTRA_CI_PULL_TIMEOUT_S:-60}"
# The Debian root file system every stand-in starts from; kept, like the stand-ins.
base="localhost/lumastra-ci/bookworm-minbase:latest"

log() { echo "standins: $*" >&2; }

exists() { "$engine" image inspect "$1" >/dev/null 2>&1; }

ensure_base() {
  if exists "$base"; then
    return
  fi
  command -v debootstrap >/dev/null || {
    log "debootstrap is missing (deploy/system-deps.sh compose installs it)"
    exit 1
  }
  local scratch
  scratch="$(mktemp -d)"
  log "making $base with debootstrap (about 30 s)"
  if ! debootstrap --variant=minbase bookworm "$scratch/rootfs" "$mirror" >"$scratch/log" 2>&1; then
    tail -20 "$scratch/log" >&2
    rm -rf "$scratch"
    exit 1
  fi
  # The apt lists debootstrap leaves behind are stale by the next build; every stand-in
  # runs apt-get update itself.
  rm -rf "$scratch"/rootfs/var/cache/apt/archives/*.deb "$scratch"/rootfs/var/lib/apt/lists/*
  if ! tar -C "$scratch/rootfs" -c . \
    | "$engine" import --change 'CMD ["bash"]' - "$base" >/dev/null 2>"$scratch/import.log"; then
    cat "$scratch/import.log" >&2
    rm -rf "$scratch"
    exit 1
  fi
  rm -rf "$scratch"
}

# standin <Containerfile stem> <image name as the project writes it>
standin() {
  local stem="$1" name="$2"
  # Docker's and podman's full name for a short Docker Hub name.
  local full="$name"
  case "$name" in
    */*/*) ;;
    */*) full="docker.io/$name" ;;
    *) full="docker.io/library/$name" ;;
  esac
  if exists "$name" || exists "$full"; then
    log "$name: present"
    return
  fi
  if [[ "${LUMASTRA_CI_NO_PULL:-0}" != 1 ]] \
    && timeout "$pull_timeout" "$engine" pull -q "$full" >/dev/null 2>&1; then
    log "$name: pulled"
    return
  fi
  ensure_base
  local began=$SECONDS layers=()
  # podman: no intermediate images left beside the stand-in (Docker's build cache is its own).
  [[ "$engine" == podman ]] && layers=(--layers=false)
  log "$name: building the stand-in from $stem.Containerfile"
  "$engine" build -q --pull=false "${layers[@]}" -f "$here/$stem.Containerfile" -t "$full" "$here" >/dev/null 2> >(grep -v '^debconf: delaying' >&2)
  log "$name: built in $((SECONDS - began)) s"
}

standin python python:3.11.11-slim-bookworm
standin postgres postgres:16.6-bookworm
standin valkey valkey/valkey:8.0-bookworm
