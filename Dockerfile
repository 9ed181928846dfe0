# TorchServe with these handlers, compiled: a C++ compiler is in the image, since inductor builds
# the kernels (and AOT packages) where the image runs. TorchServe's image conventions: a non-root
# user `model-server` (uid and gid 1000, what the manifests' runAsUser and fsGroup name), its home
# /home/model-server (0700: TorchServe writes key_file.json there before making it 0600) holding
# config.properties, key_file.json and tmp/, the model store /home/model-server/model-store as a
# volume, TorchServe's inference port.
#
#   bash scripts/build_image.sh          # where only package registries are reachable, too
#   docker build -t ts-compiled-handlers .   # with BuildKit (DOCKER_BUILDKIT=1 on Docker 20.10)
#
# docs/operations.md#container has the commands that run it, as tests/integration/test_image.py runs
# them. The layers go from what changes least to what changes most: the system packages (Java 17
# for TorchServe, g++, tcmalloc), torch, this package's dependencies, then this package alone. Only the
# installed package reaches the final image, not the source tree.
#
# BASE_IMAGE: Debian 12 (bookworm) with Python 3.10+ and venv; scripts/build_image.sh makes one with
# debootstrap where the default cannot be pulled. TORCH_SPEC and TORCH_INDEX_URL pick the torch
# build (default: the CPU build the project is tested with; empty: pip's configuration).
# Packages come through the secrets `pip.conf` and `ca-certificates` where given (never kept in a
# layer), and deploy/docker/wheels/ (a folder of wheels, empty unless the build script fills it).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS wheel
COPY setup.py pyproject.toml LICENSE /src/
COPY handlers /src/handlers
COPY scripts /src/scripts
COPY benchmarks /src/benchmarks
COPY deploy/docker/requirements.py /src/
RUN --mount=type=secret,id=pip.conf --mount=type=secret,id=ca-certificates \
    --mount=type=bind,source=deploy/docker/wheels,target=/wheels \
    export PIP_CONFIG_FILE=/run/secrets/pip.conf PIP_NO_CACHE_DIR=1 \
    && python3 -m venv /tmp/venv \
    && /tmp/venv/bin/pip wheel -q --no-deps --wheel-dir /dist /src \
    && python3 /src/requirements.py /dist/*.whl images > /dist/requirements.txt

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title=ts-compiled-handlers
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Inductor's C++ includes Python.h: Debian's python3 needs python3-dev for it (python:*-slim has it).
RUN headers=$(python3 -c 'import os, sysconfig; print("" if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else "python3-dev")') \
    && apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless g++ libtcmalloc-minimal4 $headers \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 1000 model-server \
    && useradd --uid 1000 --gid model-server --create-home --home-dir /home/model-server --shell /bin/bash model-server \
    && chmod 0700 /home/model-server
RUN --mount=type=secret,id=pip.conf --mount=type=secret,id=ca-certificates \
    --mount=type=bind,source=deploy/docker/wheels,target=/wheels \
    export PIP_CONFIG_FILE=/run/secrets/pip.conf PIP_NO_CACHE_DIR=1 \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install -q "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
COPY --from=wheel /dist/requirements.txt /opt/requirements.txt
RUN --mount=type=secret,id=pip.conf --mount=type=secret,id=ca-certificates \
    --mount=type=bind,source=deploy/docker/wheels,target=/wheels \
    PIP_CONFIG_FILE=/run/secrets/pip.conf PIP_NO_CACHE_DIR=1 /opt/venv/bin/pip install -q -r /opt/requirements.txt
RUN --mount=type=bind,from=wheel,source=/dist,target=/dist \
    /opt/venv/bin/pip install -q --no-deps --no-cache-dir /dist/*.whl

ENV PATH=/opt/venv/bin:$PATH \
    TEMP=/home/model-server/tmp \
    HFSERVE_CACHE_DIR=/home/model-server/tmp/compiled-handlers-cache \
    HFSERVE_WORKDIR=/home/model-server
USER model-server
WORKDIR /home/model-server
# The secure config, with the inference API on every interface of the container (its published
# port), token authorization on; the management API and the metrics API, which asks no key, stay on
# the container's loopback (`docker exec` reads them; the Kubernetes profiles open metrics to a
# monitoring namespace only: docs/operations.md#security).
RUN hfserve init --bind 0.0.0.0 --model-store model-store --metrics-bind 127.0.0.1 . && mkdir tmp
VOLUME /home/model-server/model-store
EXPOSE 8080
# Ready once TorchServe answers /ping with its key and every registered model has a warm worker.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s CMD ["hfserve", "health"]

COPY deploy/docker/dockerd-entrypoint.sh /usr/local/bin/dockerd-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/dockerd-entrypoint.sh"]
CMD ["serve"]
