#!/usr/bin/env bash
# Installs what deploy/ci/compose-check.sh needs to run containers without a Docker engine,
# from Debian (bookworm): podman 4.3 with runc (the default crun refuses a hybrid cgroup
# layout), netavark + aardvark-dns (the per-project network and container-to-container DNS by
# service name: measured to work here, so CNI's dnsname plugin is not needed), debootstrap (the
# stand-in base images, deploy/ci/standins/build.sh), iptables (netavark's port publishing)
# python3-venv (the virtualenv podman-compose is pinned into) and catatonit (the init the
# compose file's `init: true` asks podman for: only recommended by Debian's podman, so
# `--no-install-recommends` left it out and every container with an init failed to start).
# Idempotent: installs only the packages that are missing; does nothing when all are there.
set -euo pipefail

packages=(podman runc catatonit netavark aardvark-dns debootstrap iptables python3-venv ca-certificates)
missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-podman: all present (${packages[*]})"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  sudo=(sudo)
else
  sudo=()
fi
echo "install-podman: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}"
