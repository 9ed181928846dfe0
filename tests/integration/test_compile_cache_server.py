"""The packed compile cache and one compile per host, through a real TorchServe on loopback."""

import json
import re
import shutil
import time
import zipfile

import pytest
import requests
import yaml
from server_logs import logged_lines

from ts_compiled_handlers.compiling.compile_cache import ROOT_ENV
from ts_compiled_handlers.runtime import hardware
from ts_compiled_handlers.scripts.build_mar import STARTUP_FLOOR_SECONDS, build
from ts_compiled_handlers.scripts.cli import main as hfserve
from ts_compiled_handlers.scripts.serve import ManagementError, TorchServe

pytestmark = pytest.mark.integration

GRID = {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}
# One attempt here; tests/unit/test_compile_cache.py races four real processes three times.
ATTEMPTS = (1,)


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_bert):
    store = tmp_path_factory.mktemp("model_store")
    build(tiny_bert, "embedding", "packed", store, {"handler": GRID}, precompile="cache")
    for attempt in ATTEMPTS:  # each with an empty cache folder of its own
        # unfrozen graphs, as `--precompile cache` builds them: inductor caches no frozen graph
        own_cache = {"cache_dir": str(tmp_path_factory.mktemp(f"host-cache-{attempt}")), "freezing": False}
        config = {"minWorkers": 4, "maxWorkers": 4, "handler": {**GRID, "compile": own_cache}}
        build(tiny_bert, "embedding", f"four{attempt}", store, config)
    # Version 2.0 of `packed` (same model, a smaller grid), in a file of its own name.
    newer = build(tiny_bert, "embedding", "packed", tmp_path_factory.mktemp("v2"), {"handler": GRID}, version="2.0")
    shutil.move(newer, store / "packed-v2.mar")
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


def worker_lines(server, model: str, text: str, at_least: int = 0) -> list[str]:
    """The lines of `model`'s workers that contain `text`, once there are `at_least` of them."""
    return logged_lines(server.workdir, f"-{re.escape(model)}_1\\.0.*{re.escape(text)}", at_least)


def test_a_precompiled_archive_carries_its_cache_and_a_measured_startup_timeout(store):
    with zipfile.ZipFile(store / "packed.mar") as mar:
        manifest = json.loads(mar.read("compile_cache/manifest.json"))
        names = set(mar.namelist())
        config = yaml.safe_load(mar.read("model-config.yaml"))
    assert "compile_cache/inductor-cache.tar.gz" in names
    valid_for = manifest["valid_for"]
    assert valid_for["dtype"] == "float32"
    assert valid_for["buckets"] == {"seq_lens": [8, 32], "batch_sizes": [1, 4], "pack_tokens": 32}
    assert {"torch", "triton", "device", "cpu_flags", "compile", "model_config"} <= set(valid_for)
    assert "threads" not in valid_for and valid_for["dynamic_threads"] is True  # any worker count loads it
    assert manifest["built"]["initialize_seconds"] > 0 and manifest["built"]["graphs"] == 1
    assert config["startupTimeout"] >= max(STARTUP_FLOOR_SECONDS, 2 * manifest["built"]["initialize_seconds"])


def test_a_worker_loads_the_packed_cache_and_says_so(server):
    server.register("packed.mar", workers=1)
    response = server.predict("packed", {"inputs": "hello world"})
    assert response.status_code == 200 and len(response.json()["embedding"]) == 32
    assert len(worker_lines(server, "packed", "compile cache: hit, unpacked from the archive", 1)) == 1
    metric = re.search(r'^CompileCacheHit\{ModelName="packed".*\} ([0-9.]+)$', server.metrics(), re.MULTILINE)
    assert metric is not None and float(metric.group(1)) == 1.0


@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_four_workers_started_at_once_compile_once_and_share_it(server, attempt):
    name = f"four{attempt}"
    server.register(f"{name}.mar", workers=4)
    described = requests.get(f"{server.management_url}/models/{name}", headers=server.headers("management"), timeout=30)
    assert [worker["status"] for worker in described.json()[0]["workers"]] == ["READY"] * 4
    assert len(worker_lines(server, name, "compile cache: miss, compiled here", 1)) == 1
    assert len(worker_lines(server, name, "compile cache: hit, this host's cache from an earlier worker", 3)) == 3
    assert worker_lines(server, name, "check failed") == worker_lines(server, name, "EAGERLY") == []
    assert server.predict(name, {"inputs": ["a", "b c"]}).status_code == 200


def until_logged(server, model: str, text: str, tries: int = 40) -> list[str]:
    """Requests, a quarter second apart, until a worker of `model` has logged `text` (workers recount
    their peers before a batch, at most once a second, and TorchServe picks which worker answers)."""
    for _ in range(tries):
        if lines := worker_lines(server, model, text):
            return lines
        assert server.predict(model, {"inputs": "hello"}).status_code == 200
        time.sleep(0.25)
    return worker_lines(server, model, text)


def cli(server, capsys, command, *argv) -> dict | list:
    """`hfserve COMMAND --workdir DIR ...` against this server, its printed JSON parsed."""
    hfserve([command, "--workdir", str(server.workdir), *argv])
    return json.loads(capsys.readouterr().out)


def test_the_management_cli_scales_up_warm_versions_and_unregisters(server, capsys):
    if "packed" not in [model["modelName"] for model in cli(server, capsys, "list")]:
        cli(server, capsys, "register", "packed.mar", "--batch-size", "4", "--workers", "1")
    cli(server, capsys, "scale", "packed", "--workers", "2")
    described = cli(server, capsys, "describe", "packed")
    assert [worker["status"] for worker in described["workers"]] == ["READY"] * 2
    # The new worker came up warm: it loaded compiled kernels instead of compiling.
    assert worker_lines(server, "packed", "compile cache: miss") == []
    assert len(worker_lines(server, "packed", "compile cache: hit", 2)) == 2
    # Two workers on this host's cores: the new one starts with its share, the first one re-shares.
    cores = hardware.usable_cores()
    assert (
        len(worker_lines(server, "packed", f"Worker settings: {max(1, cores // 2)} threads, {cores} cores, 2 workers"))
        == 1
    )
    assert (
        len(
            until_logged(
                server,
                "packed",
                f"Threads re-shared: {max(1, cores // 2)} (live workers of this model: 2, cores: {cores})",
            )
        )
        == 1
    )
    cli(server, capsys, "scale", "packed", "--workers", "1")
    assert len(cli(server, capsys, "describe", "packed")["workers"]) == 1
    assert (
        len(
            until_logged(
                server, "packed", f"Threads re-shared: {cores} (live workers of this model: 1, cores: {cores})"
            )
        )
        == 1
    )

    # --workers wins over the archive's minWorkers (1), which TorchServe's registration alone would start.
    cli(server, capsys, "register", "packed-v2.mar", "--batch-size", "4", "--max-batch-delay", "7", "--workers", "2")
    newer = cli(server, capsys, "describe", "packed", "2.0")
    assert (newer["batchSize"], newer["maxBatchDelay"], len(newer["workers"])) == (4, 7, 2)
    assert cli(server, capsys, "describe", "packed")["modelVersion"] == "1.0"
    cli(server, capsys, "set-default", "packed", "2.0")
    assert cli(server, capsys, "describe", "packed")["modelVersion"] == "2.0"
    assert server.predict("packed", {"inputs": "hello"}).status_code == 200
    cli(server, capsys, "unregister", "packed", "1.0")
    with pytest.raises(ManagementError):
        server.describe("packed", "1.0")
    cli(server, capsys, "unregister", "packed")
    assert "packed" not in [model["modelName"] for model in cli(server, capsys, "list")]
