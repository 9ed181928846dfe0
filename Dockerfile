# TorchServe with these handlers, compiled: a C++ compiler is in the image, since inductor builds
# the kernels (and AOT packages) where the image runs. TorchServe's image conventions: a non-root
# user `model-server`, its home /home/model-server holding config.properties, key_file.json and
# tmp/, the model store /home/model-server/model-store as a volume, TorchServe's ports.
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
    && python3 /src/requirements.py /dist/*.whl > /dist/requirements.txt

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title=ts-compiled-handlers
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Inductor's C++ includes Python.h: Debian's python3 needs python3-dev for it (python:*-slim has it).
RUN headers=$(python3 -c 'import os, sysconfig; print("" if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else "python3-dev")') \
    && apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless g++ libtcmalloc-minimal4 $headers \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --home-dir /home/model-server --shell /bin/bash model-server
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
    COMPILED_HANDLERS_CACHE_DIR=/home/model-server/tmp/compiled-handlers-cache \
    HFSERVE_WORKDIR=/home/model-server
USER model-server
WORKDIR /home/model-server
# The secure config, with the inference and metrics APIs on every interface of the container (its
# published ports); the management API stays on the container's loopback, token authorization on.
RUN hfserve init --bind 0.0.0.0 --model-store model-store . && mkdir tmp
VOLUME /home/model-server/model-store
EXPOSE 8080 8082
# Ready once TorchServe answers /ping with its key and every registered model has a warm worker.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s CMD ["hfserve", "health"]

COPY deploy/docker/dockerd-entrypoint.sh /usr/local/bin/dockerd-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/dockerd-entrypoint.sh"]
CMD ["serve"]
