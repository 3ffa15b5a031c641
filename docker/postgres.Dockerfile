# Debian's PostgreSQL with the official postgres image's interface, as far as docker-compose.yml
# uses it: POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB initialise an empty
# /var/lib/postgresql/data; pg_isready answers on the default socket. For hosts that cannot pull
# postgres:16 (docker/local-base.sh builds it on a locally made Debian base):
#   docker build --build-arg BASE=debian:bookworm-slim -f docker/postgres.Dockerfile -t trainhub-postgres:15 .
ARG BASE=debian:bookworm-slim
FROM ${BASE}

# No cluster of Debian's own (/var/lib/postgresql/15/main): the entry point makes the one it serves.
RUN mkdir -p /etc/postgresql-common \
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
 && chmod 700 /var/lib/postgresql/data
COPY docker/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
CMD ["postgres"]
