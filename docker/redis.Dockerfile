# Debian's Redis with the official redis image's interface, as far as docker-compose.yml uses
# it: `redis-server ARGS` in /data, reachable from the other containers (protected mode off, as
# the official image builds it). For hosts that cannot pull redis:7 (docker/local-base.sh):
#   docker build --build-arg BASE=debian:bookworm-slim -f docker/redis.Dockerfile -t trainhub-redis:7 .
ARG BASE=debian:bookworm-slim
FROM ${BASE}

RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data \
 && chown redis:redis /data
COPY docker/redis-entrypoint.sh /usr/local/bin/redis-entrypoint.sh
WORKDIR /data
USER redis
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/redis-entrypoint.sh"]
CMD ["redis-server"]
