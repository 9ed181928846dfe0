"""The packed compile cache and one compile per host, through a real TorchServe on loopback."""

import json
import re
import zipfile

import pytest
import requests
import yaml

from handlers.compile_cache import ROOT_ENV
from scripts.build_mar import STARTUP_FLOOR_SECONDS, build
from scripts.serve import TorchServe

pytestmark = pytest.mark.integration

GRID = {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}
ATTEMPTS = (1, 2)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_bert):
    store = tmp_path_factory.mktemp("model_store")
    build(tiny_bert, "embedding", "packed", store, {"handler": GRID}, precompile=True)
    for attempt in ATTEMPTS:  # each with an empty cache folder of its own
        own_cache = {"cache_dir": str(tmp_path_factory.mktemp(f"host-cache-{attempt}"))}
        config = {"minWorkers": 4, "maxWorkers": 4, "handler": {**GRID, "compile": own_cache}}
        build(tiny_bert, "embedding", f"four{attempt}", store, config)
    return store


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    env = {ROOT_ENV: str(tmp_path_factory.mktemp("empty-host-cache"))}
    torchserve = TorchServe.on_free_ports(tmp_path_factory.mktemp("torchserve"), store, env=env)
    torchserve.start()
    try:
        yield torchserve
    finally:
        torchserve.stop()


def worker_lines(server, model: str, text: str) -> list[str]:
    log = (server.workdir / "logs" / "model_log.log").read_text()
    return [line for line in log.splitlines() if f"-{model}_1.0" in line and text in line]


def test_a_precompiled_archive_carries_its_cache_and_a_measured_startup_timeout(store):
    with zipfile.ZipFile(store / "packed.mar") as mar:
        manifest = json.loads(mar.read("compile_cache/manifest.json"))
        names = set(mar.namelist())
        config = yaml.safe_load(mar.read("model-config.yaml"))
    assert "compile_cache/inductor-cache.tar.gz" in names
    valid_for = manifest["valid_for"]
    assert valid_for["dtype"] == "float32" and valid_for["buckets"] == {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
    assert {"torch", "triton", "device", "cpu_flags", "threads", "compile", "model_config"} <= set(valid_for)
    assert manifest["built"]["initialize_seconds"] > 0 and manifest["built"]["graphs"] == 1
    assert config["startupTimeout"] >= max(STARTUP_FLOOR_SECONDS, 2 * manifest["built"]["initialize_seconds"])


def test_a_worker_loads_the_packed_cache_and_says_so(server):
    server.register("packed.mar", workers=1)
    response = server.predict("packed", {"inputs": "hello world"})
    assert response.status_code == 200 and len(response.json()["embedding"]) == 32
    assert len(worker_lines(server, "packed", "compile cache: hit, unpacked from the archive")) == 1
    metric = re.search(r'^CompileCacheHit\{ModelName="packed".*\} ([0-9.]+)$', server.metrics(), re.MULTILINE)
    assert metric is not None and float(metric.group(1)) == 1.0


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_four_workers_started_at_once_compile_once_and_share_it(server, attempt):
    name = f"four{attempt}"
    server.register(f"{name}.mar", workers=4)
    described = requests.get(f"{server.management_url}/models/{name}", headers=server.headers("management"), timeout=30)
    assert [worker["status"] for worker in described.json()[0]["workers"]] == ["READY"] * 4
    assert len(worker_lines(server, name, "compile cache: miss, compiled here")) == 1
    assert len(worker_lines(server, name, "compile cache: hit, this host's cache from an earlier worker")) == 3
    assert worker_lines(server, name, "check failed") == worker_lines(server, name, "EAGERLY") == []
    assert server.predict(name, {"inputs": ["a", "b c"]}).status_code == 200
