#!/usr/bin/env bash
# Local images for hosts that cannot pull public ones (podman or docker):
#   localhost/trainhub-base:bookworm      Debian bookworm (minbase) with Debian's Python 3.11, pip and
#                                         `python`: what the trainhub images need of python:3.11-slim
#   localhost/trainhub-postgres:15        Debian's PostgreSQL 15 behind postgres:16's interface
#   localhost/trainhub-redis:7            Debian's Redis 7 behind redis:7's interface
# made from the Debian mirror alone (mmdebstrap, else debootstrap). Then:
#   TRAINHUB_BASE_IMAGE=localhost/trainhub-base:bookworm \
#   TRAINHUB_POSTGRES_IMAGE=localhost/trainhub-postgres:15 \
#   TRAINHUB_REDIS_IMAGE=localhost/trainhub-redis:7 podman-compose up -d --build
# `local-base.sh base` makes only the base, `local-base.sh services` only the PostgreSQL and Redis
# images (from an existing base). Needs root (the bootstrap chroots). MIRROR, SUITE and ENGINE
# (podman or docker) may be set; REBUILD=1 makes the base again.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE="${ENGINE:-podman}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SUITE="${SUITE:-bookworm}"
BASE=localhost/trainhub-base:bookworm
PACKAGES=python3,python3-pip,python-is-python3,ca-certificates

WHAT="${1:-all}"
case "$WHAT" in all|base|services) ;; *) echo "usage: $0 [all|base|services]" >&2; exit 2 ;; esac

stamp() { printf '%s local-base: %s\n' "$(date +%T)" "$*"; }

if [ "$WHAT" = services ]; then
    :
elif [ -z "${REBUILD:-}" ] && "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
    stamp "$BASE already exists (REBUILD=1 makes it again)"
else
    root="$(mktemp -d)"
    trap 'rm -rf "$root"' EXIT
    stamp "bootstrapping Debian $SUITE with $PACKAGES"
    if command -v mmdebstrap >/dev/null; then  # apt resolves and fetches in parallel: ~5x debootstrap
        mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
            --dpkgopt=force-unsafe-io --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
            "$SUITE" "$root/rootfs" "$MIRROR"
    else
        debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root/rootfs" "$MIRROR" >/dev/null
    fi
    # The host's own CAs (a TLS proxy's, a private mirror's) are trusted inside as well, so apt and
    # pip in the builds reach what the host reaches.
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/rootfs/usr/local/share/ca-certificates/"
        chroot "$root/rootfs" update-ca-certificates >/dev/null
    fi
    tar -C "$root/rootfs" -cf "$root/rootfs.tar" .
    tarball="$root/rootfs.tar"
    # As python:3.11-slim: `pip install` into the system Python (Debian refuses it by default,
    # PEP 668), UTF-8, a shell as the default command.
    "$ENGINE" import \
        --change 'ENV LANG=C.UTF-8' --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'CMD ["bash"]' \
        "$tarball" "$BASE" >/dev/null
    rm -rf "$root"
    trap - EXIT
    stamp "made $BASE"
fi

[ "$WHAT" = base ] && exit 0
# Both from the repository root, as the compose file's builds are.
stamp "building localhost/trainhub-postgres:15 and localhost/trainhub-redis:7"
"$ENGINE" build --quiet --build-arg BASE="$BASE" -f docker/postgres.Dockerfile -t localhost/trainhub-postgres:15 . &
postgres=$!
"$ENGINE" build --quiet --build-arg BASE="$BASE" -f docker/redis.Dockerfile -t localhost/trainhub-redis:7 . >/dev/null
wait "$postgres" >/dev/null
stamp "done"
