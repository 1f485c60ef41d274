# syntax=docker/dockerfile:1
# The kneepoint image: `kneepoint operator` (the chart's Deployment), `kneepoint loadgen`
# (the operator's load-test Jobs), `kneepoint sim` (Simulate-mode engines) and
# `kneepoint probe` (the node-probe DaemonSet), all from one installed wheel.
#
#   docker build -t ghcr.io/kneepoint/kneepoint:0.1.0 .
#   make images      # buildah, on a Debian base made with debootstrap (docs/install.md)
#
# Runs as user 65532 with no shell use at run time (exec-form ENTRYPOINT); every file
# it needs is written at build time, so the root filesystem can be mounted read-only.
# `make images` builds it and runs it that way; tests/contract/test_dockerfiles.py lints it.

# Any Debian-like base with python3 (3.11) and its venv module: today's python:slim by
# default, or the Debian bookworm root filesystem `make images` makes with debootstrap.
# Both stages use the same base because a venv runs the base's interpreter (python3 is in
# /usr/local/bin on python:slim, /usr/bin on Debian); nothing here names either path.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# The dependencies first, from the lock files `make` installs the test venv from (exact
# versions and sha256 hashes, transitive ones included): this layer is reused while only
# the code changes.
COPY requirements/build.txt requirements/runtime.txt /tmp/requirements/
RUN python3 -m venv /tmp/build \
 && /tmp/build/bin/pip install --require-hashes --no-deps --requirement /tmp/requirements/build.txt \
 && python3 -m venv /opt/kneepoint \
 && /opt/kneepoint/bin/pip install --require-hashes --no-deps --requirement /tmp/requirements/runtime.txt

WORKDIR /src
# pyproject.toml names README.md as the package's readme; setuptools puts LICENSE in the wheel.
COPY pyproject.toml README.md LICENSE ./
COPY operator ./operator

# The wheel is built with the locked setuptools (no build isolation, so nothing unpinned is
# fetched); pip compiles the bytecode here; pip check proves the lock is complete.
RUN /tmp/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /tmp/wheels . \
 && /opt/kneepoint/bin/pip install --no-deps /tmp/wheels/kneepoint-*.whl \
 && /opt/kneepoint/bin/pip check \
 && /opt/kneepoint/bin/pip uninstall --yes pip setuptools \
 && /opt/kneepoint/bin/kneepoint --help > /dev/null

FROM ${BASE_IMAGE}
ARG BASE_IMAGE

LABEL org.opencontainers.image.title="kneepoint" \
      org.opencontainers.image.description="Kubernetes operator that measures how many GPUs an LLM inference replica should use" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"

COPY --from=build /opt/kneepoint /opt/kneepoint

ENV PATH=/opt/kneepoint/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Numeric, so Kubernetes can check runAsNonRoot without an /etc/passwd entry.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["kneepoint"]
CMD ["--help"]
