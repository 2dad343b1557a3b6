# gpugap images, one per component, each with only its install extra (pyproject.toml):
#   docker build --target nvml -t gpugap-nvml .        the NVML node agent (DaemonSet)
#   docker build --target dcgm -t gpugap-dcgm .        the dcgm-exporter scraper
#   docker build --target kubernetes -t gpugap-k8s .   the Kubernetes pod producer
#   docker build --target slurm -t gpugap-slurm .      the Slurm poller and spool drain
#   docker build --target worker -t gpugap-worker .    the stream worker (Faust)
#   docker build --target sink -t gpugap-sink .        the ClickHouse sink, migrations, report
#   docker build -t gpugap .                           everything (the default: docker-compose.yml)
# Kafka and ClickHouse run from their own official images; none of these needs Java.
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# the package only (tests, benchmarks and local state stay out: .dockerignore)
COPY pyproject.toml README.md ./
COPY gpugap ./gpugap
COPY groundfloor ./groundfloor
COPY schemas ./schemas
COPY producers ./producers
COPY streams ./streams
COPY sinks ./sinks
COPY warehouse ./warehouse
RUN useradd --system --uid 10001 --home-dir /var/lib/gpugap --create-home gpugap
# The worker keeps its local table state under its working directory (a named volume in
# docker-compose.yml); nothing runs as root.
ENTRYPOINT ["gpugap"]
CMD ["--help"]

FROM base AS nvml
RUN pip install ".[nvml]"
USER gpugap
WORKDIR /var/lib/gpugap

FROM base AS dcgm
RUN pip install ".[dcgm]"
USER gpugap
WORKDIR /var/lib/gpugap

FROM base AS kubernetes
RUN pip install ".[kubernetes]"
USER gpugap
WORKDIR /var/lib/gpugap

FROM base AS slurm
RUN pip install ".[slurm]"
USER gpugap
WORKDIR /var/lib/gpugap

FROM base AS worker
RUN pip install ".[worker]"
USER gpugap
WORKDIR /var/lib/gpugap

FROM base AS sink
RUN pip install ".[clickhouse]"
USER gpugap
WORKDIR /var/lib/gpugap

FROM base AS all
RUN pip install ".[all]"
USER gpugap
WORKDIR /var/lib/gpugap
