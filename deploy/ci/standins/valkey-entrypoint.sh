#!/bin/sh
# The Valkey stand-in's entrypoint: as the official image's, the server runs as its own user
# (here Debian's `redis`), owning /data (a fresh named volume belongs to root).
set -e
if [ "$(id -u)" = 0 ] && { [ "$1" = valkey-server ] || [ "$1" = redis-server ]; }; then
  find /data \! -user redis -exec chown redis:redis '{}' +
  exec setpriv --reuid=redis --regid=redis --init-groups "$@"
fi
exec "$@"
