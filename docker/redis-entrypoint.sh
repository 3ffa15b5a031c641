#!/bin/sh
# docker/redis.Dockerfile's entry point: `redis-server ARGS` listens on every address with
# protected mode off (as the official image's build does; the compose network is private).
set -eu
if [ "${1:-}" = redis-server ]; then
    shift
    set -- redis-server --bind '* -::*' --protected-mode no "$@"
fi
exec "$@"
