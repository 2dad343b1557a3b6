# The gpugap image: every gpugap service in docker-compose.yml is `gpugap <command>` from it.
# Kafka and ClickHouse run from their own official images; this one needs no Java.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# the package only (tests and local state stay out: .dockerignore)
COPY pyproject.toml README.md ./
COPY gpugap ./gpugap
COPY schemas ./schemas
COPY producers ./producers
COPY streams ./streams
COPY sinks ./sinks
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /var/lib/gpugap --create-home gpugap

# The worker keeps its local table state under its working directory (a named volume in
# docker-compose.yml); nothing runs as root.
USER gpugap
WORKDIR /var/lib/gpugap
ENTRYPOINT ["gpugap"]
CMD ["--help"]
