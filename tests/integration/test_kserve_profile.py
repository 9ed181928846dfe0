"""deploy/kserve's Kubernetes profile run by a real TorchServe, on loopback.

The layout of scripts/kserve_layout.py, its config.properties with the addresses moved from
0.0.0.0 to 127.0.0.1 and free ports (the one change): models load from model_snapshot at start,
the layout's readiness probe (ready.py) fails until the worker is warm and passes after, /ping
needs no token, v2 requests need no token, and the management API registers nothing.
"""

import subprocess
import sys
import time

import pytest
import requests
from server_logs import logged_lines

from ts_compiled_handlers.scripts.build_mar import build
from ts_compiled_handlers.scripts.kserve_layout import write_layout
from ts_compiled_handlers.scripts.serve import DEFAULT_PORTS, TorchServe, free_ports

pytestmark = pytest.mark.integration

GRID = {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}


def on_loopback(config: str, ports: dict[str, int], layout) -> str:
    """The profile with this test's addresses and the layout's paths instead of the pod's."""
    config = config.replace("0.0.0.0:8080", f"127.0.0.1:{ports['INFERENCE_PORT']}")
    config = config.replace("127.0.0.1:8081", f"127.0.0.1:{ports['MANAGEMENT_PORT']}")
    config = config.replace("0.0.0.0:8082", f"127.0.0.1:{ports['METRICS_PORT']}")
    config = config.replace("port=7070", f"port={ports['GRPC_INFERENCE_PORT']}")
    config = config.replace("port=7071", f"port={ports['GRPC_MANAGEMENT_PORT']}")
    assert "0.0.0.0" not in config
    return config.replace("/mnt/models", str(layout))


@pytest.fixture(scope="module")
def pod(tmp_path_factory, tiny_bert):
    mar = build(tiny_bert, "embedding", "tiny", tmp_path_factory.mktemp("store"), {"handler": GRID})
    layout = write_layout([mar], tmp_path_factory.mktemp("layout"), batch_size=4, max_batch_delay=5, workers=1)
    ports = dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS)), strict=True))
    config = on_loopback((layout / "config" / "config.properties").read_text(), ports, layout)
    server = TorchServe(tmp_path_factory.mktemp("pod"), layout / "model-store", ports)
    server.start(config_text=config)
    probes = []  # (ready.py's exit code, ready lines in the worker log just before it ran)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not probes or probes[-1][0] != 0):
        lines = ready_lines(server)
        probe = [sys.executable, str(layout / "config" / "ready.py"), server.management_url]
        probes.append((subprocess.run(probe, capture_output=True, timeout=30).returncode, lines))
        time.sleep(0.5)
    try:
        yield server, probes
    finally:
        server.stop()


READY = r"tiny_1\.0-stdout MODEL_LOG - Ready in"


def ready_lines(server) -> int:
    return len(logged_lines(server.workdir, READY, at_least=0))


def test_the_readiness_probe_passes_only_once_the_model_is_warm(pod):
    server, probes = pod
    assert probes[-1][0] == 0, probes[-5:]
    not_ready = [lines for code, lines in probes if code != 0]
    assert not_ready and max(not_ready) == 0, "the probe failed after, or never during, the warm-up"
    assert len(logged_lines(server.workdir, READY, at_least=1)) == 1
    assert requests.get(f"{server.inference_url}/ping", timeout=5).status_code == 200  # liveness, no token


def test_v2_requests_need_no_token_inside_the_pod(pod):
    server, _ = pod
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a cat", "a dog"]}]}
    response = requests.post(f"{server.inference_url}/v2/models/tiny/infer", json=body, timeout=60)
    assert response.status_code == 200 and response.json()["outputs"][0]["shape"] == [2, 32]


def test_the_management_api_registers_nothing(pod):
    server, _ = pod
    assert [model["modelName"] for model in server.list_models()] == ["tiny"]
    response = requests.post(f"{server.management_url}/models", params={"url": "tiny.mar"}, timeout=30)
    assert response.status_code in (403, 405), response.text
