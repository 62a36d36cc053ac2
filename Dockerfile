# syntax=docker/dockerfile:1.7
#
# topo-tune container images. Two targets from one file:
#
#   docker build --target controller -t topo-tune/controller:0.1.0 .
#   docker build --target agent      -t topo-tune/agent:0.1.0 .
#
# controller: Python slim base, no torch, no CUDA, runs as an unprivileged user (UID 10001).
# agent:      CUDA runtime base with torch (which brings NCCL) and the NCCL tuner plugin; runs as root
#             because it writes node-local config that every training pod on the node reads (see below).
# Both images run `topo-tune` as their entrypoint, so `docker run IMAGE controller serve ...` and
# `docker run IMAGE agent run ...` take exactly the CLI's arguments.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# torch's CUDA wheels carry their own CUDA libraries and NCCL; the base only needs to match the node's
# driver generation (the NVIDIA container runtime injects the driver itself).
ARG AGENT_BASE_IMAGE=nvidia/cuda:12.9.1-runtime-ubuntu24.04
# The torch release the agent's nccl/gloo backends are tested with.
ARG TORCH_VERSION=2.13.0

# ---------------------------------------------------------------------------------------------------------
# wheel: build the topo-tune wheel once; both images install the same artifact.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY topo_tune ./topo_tune
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip wheel --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------------------------------------------------
# controller-venv: the controller's virtual environment (PostgreSQL driver included, torch excluded).
FROM ${PYTHON_IMAGE} AS controller-venv
COPY --from=wheel /wheels /wheels
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m venv /opt/topo-tune \
    && wheel="$(ls /wheels/topo_tune-*.whl)" \
    && /opt/topo-tune/bin/pip install "${wheel}[postgres]"

# ---------------------------------------------------------------------------------------------------------
# agent-build: the agent's virtual environment with torch, plus the compiled NCCL tuner plugin.
FROM ${AGENT_BASE_IMAGE} AS agent-build
ARG TORCH_VERSION
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels /wheels
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/topo-tune \
    && wheel="$(ls /wheels/topo_tune-*.whl)" \
    && /opt/topo-tune/bin/pip install "torch==${TORCH_VERSION}" "${wheel}[agent]"
# --- NCCL tuner plugin -------------------------------------------------------------------------------------
# `topo-tune plugin build` compiles the C tuner plugin shipped in the topo_tune.plugin package (libc only, no
# NCCL/CUDA headers) into /opt/topo-tune/lib/libnccl-tuner-topotune.so, which NCCL loads through
# NCCL_TUNER_PLUGIN. A failed compile fails the image build.
RUN /opt/topo-tune/bin/topo-tune plugin build --output /opt/topo-tune/lib \
    && test -f /opt/topo-tune/lib/libnccl-tuner-topotune.so

# ---------------------------------------------------------------------------------------------------------
# agent: runtime image for the per-node DaemonSet.
FROM ${AGENT_BASE_IMAGE} AS agent
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=agent-build /opt/topo-tune /opt/topo-tune
ENV PATH=/opt/topo-tune/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Root on purpose: the agent writes config versions into host directories (/etc/nccl/topo-tune and its
# state dir, mounted with hostPath) that are root-owned on the node and read by training pods of any UID.
# The Helm chart still drops every capability, forbids privilege escalation and mounts the root
# filesystem read-only; the agent needs no capability to write directories its own UID owns.
USER 0:0
WORKDIR /var/lib/topo-tune
ENTRYPOINT ["/opt/topo-tune/bin/topo-tune"]
CMD ["agent", "run", "--help"]

# ---------------------------------------------------------------------------------------------------------
# controller: the default target (last stage).
FROM ${PYTHON_IMAGE} AS controller
COPY --from=controller-venv /opt/topo-tune /opt/topo-tune
RUN groupadd --system --gid 10001 topo-tune \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/topo-tune --create-home \
       --shell /usr/sbin/nologin topo-tune
ENV PATH=/opt/topo-tune/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# gRPC (agents, admins), Prometheus metrics, plaintext gRPC health (used when the main port is mTLS).
EXPOSE 50051 9464 50052
USER 10001:10001
WORKDIR /var/lib/topo-tune
ENTRYPOINT ["/opt/topo-tune/bin/topo-tune"]
CMD ["controller", "serve", "--help"]
