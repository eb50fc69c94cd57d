# syntax=docker/dockerfile:1
# specwatch container image: a sidecar that watches a pair of vLLM servers.
#
# Build:  docker build -t specwatch:0.1.0 .
# Run:    docker run --read-only --tmpfs /tmp -v specwatch-data:/var/lib/specwatch \
#           -p 9477:9477 specwatch:0.1.0 run --config /etc/specwatch/config.yaml
#
# Base pinned by tag and digest (Debian bookworm, CPython 3.11.10). Bump both together.
ARG PYTHON_IMAGE=python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

# ---------------------------------------------------------------------------------------------
# builder: build the specwatch wheel and install it with its dependencies into /opt/venv
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY specwatch ./specwatch

# The wheel is built from this tree only; the venv gets the wheel plus its declared dependencies.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels /src \
 && /opt/venv/bin/pip install --no-compile /wheels/specwatch-*.whl \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib

# ---------------------------------------------------------------------------------------------
# runtime: no compilers, no build tree, non-root, nothing written outside /tmp and /var/lib/specwatch
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="specwatch" \
      org.opencontainers.image.description="Watchdog sidecar for vLLM speculative decoding: acceptance health, token-budget starvation and paired quality drift (FLy vs standard)." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# Numeric uid/gid so Kubernetes runAsNonRoot can verify the user without /etc/passwd lookups.
RUN groupadd --system --gid 10001 specwatch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/specwatch \
      --shell /usr/sbin/nologin specwatch \
 && mkdir -p /var/lib/specwatch /etc/specwatch \
 && chown 10001:10001 /var/lib/specwatch

COPY --from=builder /opt/venv /opt/venv

# Read-only root filesystem: bytecode was compiled at build time and nothing writes it at run
# time; temporary files go to /tmp (an emptyDir or --tmpfs) and state to /var/lib/specwatch.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    HOME=/var/lib/specwatch \
    MPLCONFIGDIR=/tmp/matplotlib \
    SPECWATCH_SERVER__PORT=9477

WORKDIR /var/lib/specwatch
VOLUME ["/var/lib/specwatch"]
USER 10001:10001

# 9477: /metrics, /healthz, /readyz, /api/v1/*. 9401: the optional streaming proxy. 9402: the
# mirror listener (/v1/completions, /v1/chat/completions with a "-shadow" Host; mesh only).
EXPOSE 9477 9401 9402

# Liveness only (process serves HTTP); python stdlib, no curl in the image.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; port = os.environ.get('SPECWATCH_SERVER__PORT', '9477'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["specwatch"]
CMD ["run"]
