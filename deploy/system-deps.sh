#!/usr/bin/env bash
# The machine's set-up step: the Debian packages a purpose needs, installed when missing.
#
#   deploy/system-deps.sh run       what `make run` needs: ffmpeg (the media stages)
#   deploy/system-deps.sh test      what `make test` needs: ffmpeg, chromium (the browser
#                                   tests), iproute2 and nftables (the partition scenarios),
#                                   prometheus (promtool checks deploy/observability/'s rules)
#   deploy/system-deps.sh compose   what deploy/ci/compose-check.sh needs (podman and friends)
#
# Each package is judged by a file it installs, so a copy from elsewhere on PATH counts too.
# When something is missing it runs `apt-get install` as root (or through sudo, when sudo
# needs no password); when it cannot, it prints one line per missing package with the command
# that installs it and exits 1, before anything that needs it starts.
# `make test` honours LUMASTRA_TEST_SKIP (tests/support/categories.py): a test category the
# person running it opted out of needs nothing here (browser: chromium; partitions: iproute2
# and nftables; media: ffmpeg; alerts: prometheus).
set -euo pipefail

purpose="${1:-}"
skip=",${LUMASTRA_TEST_SKIP:-},"

# package: the command (or absolute path) that shows it is there
declare -A provides=(
  [ffmpeg]="ffmpeg ffprobe"
  [chromium]="${CHROMIUM_PATH:-/usr/bin/chromium}"
  [iproute2]="ip"
  [nftables]="nft"
  [prometheus]="promtool"
  [podman]="podman"
  [runc]="runc"
  [catatonit]="/usr/libexec/podman/catatonit"
  [netavark]="/usr/lib/podman/netavark"
  [aardvark-dns]="/usr/lib/podman/aardvark-dns"
  [debootstrap]="debootstrap"
  [iptables]="iptables"
  [python3-venv]="/usr/lib/python3.11/ensurepip/__init__.py"
  [ca-certificates]="/etc/ssl/certs/ca-certificates.crt"
)

case "$purpose" in
  run) packages=(ffmpeg) ;;
  test)
    packages=()
    [[ $skip == *,media,* ]] || packages+=(ffmpeg)
    [[ $skip == *,browser,* ]] || packages+=(chromium)
    [[ $skip == *,partitions,* ]] || packages+=(iproute2 nftables)
    [[ $skip == *,alerts,* ]] || packages+=(prometheus)
    ;;
  compose)
    # catatonit: the init the compose file's `init: true` asks podman for, only recommended by
    # Debian's podman; runc: the default crun refuses this machine's hybrid cgroups;
    # netavark + aardvark-dns: the per-project network and DNS by service name (CNI's dnsname
    # plugin is not needed); debootstrap: the stand-in base images (deploy/ci/standins/);
    # iptables: netavark's port publishing; python3-venv: where podman-compose is pinned.
    packages=(podman runc catatonit netavark aardvark-dns debootstrap iptables python3-venv ca-certificates)
    ;;
  *)
    echo "usage: $0 run|test|compose" >&2
    exit 2
    ;;
esac

present() {
  local what
  for what in ${provides[$1]}; do
    if [[ $what == /* ]]; then
      [[ -e $what ]] || return 1
    else
      # `ip` and `nft` live in /usr/sbin, off a plain user's PATH.
      PATH="$PATH:/usr/sbin:/sbin" command -v "$what" >/dev/null || return 1
    fi
  done
}

missing=()
for package in "${packages[@]}"; do
  present "$package" || missing+=("$package")
done
((${#missing[@]} == 0)) && exit 0

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  as_root=(none)
fi
if [[ ${as_root[0]:-} != none ]] && command -v apt-get >/dev/null; then
  echo "system-deps: installing ${missing[*]} (apt-get, for '$purpose')"
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  still=()
  for package in "${missing[@]}"; do
    present "$package" || still+=("$package")
  done
  ((${#still[@]} == 0)) && exit 0
  missing=("${still[@]}")
fi

for package in "${missing[@]}"; do
  echo "system-deps: missing Debian package '$package' (for '$purpose'): sudo apt-get install -y --no-install-recommends $package" >&2
done
if [[ $purpose == test ]]; then
  echo "system-deps: or opt out of the tests that need it: LUMASTRA_TEST_SKIP=browser,partitions,media (any of them)" >&2
fi
exit 1
