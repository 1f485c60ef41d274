# syntax=docker/dockerfile:1
# The kneepoint image: `kneepoint operator` (the chart's Deployment), `kneepoint loadgen`
# (the operator's load-test Jobs), `kneepoint sim` (Simulate-mode engines) and
# `kneepoint probe` (the node-probe DaemonSet), all from one installed wheel.
#
#   docker build -t ghcr.io/kneepoint/kneepoint:0.1.0 .
#
# Runs as user 65532 with no shell use at run time (exec-form ENTRYPOINT); every file
# it needs is written at build time, so the root filesystem can be mounted read-only.
# tests/contract/test_dockerfiles.py lints this file with hadolint and runs the same
# install steps outside Docker (see docs/install.md).

# One pinned base for both stages: the virtual environment's interpreter path
# (/usr/local/bin/python3.11) must be the same where it is built and where it runs.
FROM python:3.11.13-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
# pyproject.toml names README.md as the package's readme, so the wheel build needs it.
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY docker/constraints.txt /tmp/constraints.txt

# Build the wheel, then install it with every runtime dependency pinned to the versions
# the test suite runs with (docker/constraints.txt); pip compiles the bytecode here.
RUN python -m pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && python -m venv /opt/kneepoint \
 && /opt/kneepoint/bin/pip install --constraint /tmp/constraints.txt /tmp/wheels/kneepoint-*.whl \
 && /opt/kneepoint/bin/pip uninstall --yes pip setuptools \
 && /opt/kneepoint/bin/kneepoint --help > /dev/null

FROM python:3.11.13-slim-bookworm

LABEL org.opencontainers.image.title="kneepoint" \
      org.opencontainers.image.description="Kubernetes operator that measures how many GPUs an LLM inference replica should use" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=build /opt/kneepoint /opt/kneepoint

ENV PATH=/opt/kneepoint/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Numeric, so Kubernetes can check runAsNonRoot without an /etc/passwd entry.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["kneepoint"]
CMD ["--help"]
