# syntax=docker/dockerfile:1
# TorchServe with these handlers, on TorchServe's own image conventions: a non-root user
# `model-server`, its home /home/model-server holding config.properties and tmp/, the model store
# /home/model-server/model-store as a volume, TorchServe's ports. The install steps are
# scripts/install.sh with INSTALL=wheel, which the tests also run in a fresh venv
# (tests/integration/test_embedding_server.py): Java 17, a venv, torch first, then a wheel of this
# checkout, installed as a user would.
#
#   docker build -t ts-compiled-handlers:0.1.0 .
#   docker run -p 8080:8080 -p 8082:8082 -v $PWD/model_store:/home/model-server/model-store \
#       ts-compiled-handlers:0.1.0 serve --models minilm=minilm.mar   # what follows `serve` goes to torchserve
#   docker exec CONTAINER cat /home/model-server/key_file.json     # the API tokens
# The management API stays on the container's loopback (docker exec to reach it).
#
# The entry point (deploy/docker/dockerd-entrypoint.sh) is TorchServe's convention: `serve` (the
# default) starts TorchServe in the foreground with this config; any other command runs as given
# (KServe's TorchServe runtime passes `torchserve --start ...`, see deploy/kserve/).
#
# Debian 12 (bookworm): the release tested, whose openjdk-17-jre-headless the install script takes.
# TORCH_SPEC and TORCH_INDEX_URL pick the torch build (default: the CPU build the project is tested with).
FROM python:3.11-slim-bookworm

ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

RUN useradd --create-home --home-dir /home/model-server --shell /bin/bash model-server
COPY . /opt/ts-compiled-handlers
RUN cd /opt/ts-compiled-handlers \
    && INSTALL=wheel VENV=/opt/venv DIST=/tmp/dist bash scripts/install.sh \
    && rm -rf /tmp/dist /root/.cache /var/lib/apt/lists/*

ENV PATH=/opt/venv/bin:$PATH \
    TEMP=/home/model-server/tmp \
    COMPILED_HANDLERS_CACHE_DIR=/home/model-server/tmp/compiled-handlers-cache
USER model-server
WORKDIR /home/model-server
# The secure config, with the inference and metrics APIs on every interface of the container (its
# published ports); the management API stays on the container's loopback, token authorization on.
RUN hfserve init --bind 0.0.0.0 --model-store model-store . && mkdir tmp
VOLUME /home/model-server/model-store
EXPOSE 8080 8082

COPY --chmod=755 deploy/docker/dockerd-entrypoint.sh /usr/local/bin/dockerd-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/dockerd-entrypoint.sh"]
CMD ["serve"]
