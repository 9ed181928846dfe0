"""The MiniLM archive through a real TorchServe (Java), installed and started as a user would who
installs the wheel (not editable, in a fresh venv: scripts/install.sh with INSTALL=wheel, the
Dockerfile's steps) and works in an empty folder:

    hfserve init                                   # config.properties, metrics.yaml, model_store/
    hfserve build --model MINILM --model-name minilm [--config ...]
    torchserve --start --ncs --ts-config config.properties --model-store model_store --models minilm=minilm.mar

(the README's plain path: the config as `init` wrote it, the ports moved only if TorchServe's usual
ones are busy), and then with `hfserve start` and `hfserve register`. Nothing may be written into
the installed package, and the wheel holds nothing but the package.
"""

import json
import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from server_logs import log_text
from wheel_install import WheelInstall

from ts_compiled_handlers.runtime import allocator
from ts_compiled_handlers.scripts.serve import DEFAULT_PORTS, TorchServe, busy, free_ports, port_settings, with_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "hello world",
    "TorchServe answers embedding requests from a compiled model.",
    "Die Katze schläft auf dem Sofa, und der Hund bellt. 猫はソファで寝ています。",
    "word " * 400,  # longer than the largest bucket: truncated at 256 tokens, as encode does
]
# (model name, extra model-config, minimum cosine to sentence-transformers' float32 encode):
# minilm32 takes TorchServe's request batches, minilm schedules by tokens in the worker.
BATCHING = {"batchSize": 8, "maxBatchDelay": 20}
MODELS = [
    ("minilm32", {**BATCHING, "handler": {"dtype": "float32"}}, 0.9999),
    ("minilm", {"asyncCommunication": True}, 0.999),
]
MIN_COSINE = {name: cosine for name, _, cosine in MODELS}


@pytest.fixture(scope="module")
def wheel(wheel_install) -> WheelInstall:
    return wheel_install.ready()


@pytest.fixture(scope="module")
def installed_files(wheel) -> set[str]:
    """site-packages before any command ran from the wheel."""
    return wheel.files()


@pytest.fixture(scope="module")
def server(tmp_path_factory, minilm_dir, wheel, installed_files):
    root = tmp_path_factory.mktemp("empty_folder")
    wheel.hfserve("init", cwd=root)
    for name, extra, _ in MODELS:
        (root / f"{name}.yaml").write_text(json.dumps(extra))  # JSON is YAML
        wheel.hfserve("build", "--model", str(minilm_dir), "--model-name", name, "--config", f"{name}.yaml", cwd=root)
    ports = DEFAULT_PORTS
    if any(busy(port) for port in ports.values()):
        ports = dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS)), strict=True))
        config = root / "config.properties"
        config.write_text(with_settings(config.read_text(), port_settings(ports)))
    torchserve = TorchServe(root, root / "model_store", ports, env=wheel.env)
    if "LD_PRELOAD" not in {**os.environ, **wheel.env}:  # as typed: no allocator chosen for it
        torchserve.env.pop("LD_PRELOAD", None)
    torchserve.bin_dir = wheel.venv / "bin"
    models = [f"{name}={name}.mar" for name, _, _ in MODELS]
    torchserve.run(
        "--start", "--ncs", "--ts-config", "config.properties", "--model-store", "model_store", "--models", *models
    )
    try:
        torchserve.wait_until_ready([name for name, _, _ in MODELS])
        yield torchserve
    finally:
        torchserve.stop()


@pytest.fixture(scope="module")
def tokenized(minilm_dir):
    """Texts as MiniLM's tokenizer cuts them (256 tokens at most): each request's usage."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    return lambda texts: tokenizer(texts, truncation=True, max_length=256)["input_ids"]


@pytest.fixture(scope="module")
def reference(minilm_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    return lambda texts: model.encode(texts, convert_to_tensor=True)


def cosines(answers, expected) -> list[float]:
    got = torch.tensor([answer["embedding"] for answer in answers])
    return torch.nn.functional.cosine_similarity(got, expected).tolist()


@pytest.mark.parametrize("name, min_cosine", [(name, cosine) for name, _, cosine in MODELS])
def test_embeddings_agree_with_sentence_transformers(server, reference, name, min_cosine):
    singles = [server.predict(name, {"inputs": text}) for text in TEXTS]
    assert [response.status_code for response in singles] == [200] * len(TEXTS)
    assert min(cosines([r.json() for r in singles], reference(TEXTS))) >= min_cosine
    listed = server.predict(name, {"inputs": TEXTS})
    assert listed.status_code == 200 and len(listed.json()) == len(TEXTS)
    assert min(cosines(listed.json(), reference(TEXTS))) >= min_cosine
    raw = server.predict(name, TEXTS[1].encode(), content_type="text/plain")
    assert min(cosines([raw.json()], reference(TEXTS[1:2]))) >= min_cosine


@pytest.mark.parametrize("name", MIN_COSINE)
def test_fifty_concurrent_requests_of_mixed_lengths_each_get_their_own_right_answer(server, reference, tokenized, name):
    texts = [f"request number {i}: " + "tokens " * (i * 5 % 120) for i in range(50)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        responses = list(pool.map(lambda text: server.predict(name, {"inputs": text}), texts))
    assert [response.status_code for response in responses] == [200] * 50
    assert min(cosines([r.json() for r in responses], reference(texts))) >= MIN_COSINE[name]
    assert [int(r.headers["x-prompt-tokens"]) for r in responses] == [len(t) for t in tokenized(texts)]


@pytest.mark.parametrize("name", MIN_COSINE)
def test_a_bad_request_in_a_busy_batch_gets_its_4xx_and_the_others_200(server, name):
    bodies = [{"inputs": f"good request {i}"} for i in range(15)]
    bodies[7] = b'{"inputs": '  # invalid JSON
    bodies[11] = {"inputs": ["fine", 3]}  # a list with a non-string
    with ThreadPoolExecutor(max_workers=15) as pool:
        responses = list(pool.map(lambda body: server.predict(name, body), bodies))
    codes = [response.status_code for response in responses]
    assert codes == [200] * 7 + [400] + [200] * 3 + [400] + [200] * 3
    assert responses[7].json()["code"] == 400 and "not valid JSON" in responses[7].json()["error"]
    assert "'inputs'[1] is not a string" in responses[11].json()["error"]
    assert server.ping().status_code == 200


@pytest.mark.parametrize("name", MIN_COSINE)
def test_kserve_v2_requests_share_batches_with_plain_ones_and_get_their_own_answers(server, reference, name):
    texts = TEXTS[:3]
    with ThreadPoolExecutor(max_workers=12) as pool:
        v2 = [pool.submit(server.infer_v2, name, texts, f"req-{i}") for i in range(5)]
        plain = [pool.submit(server.predict, name, {"inputs": texts}) for _ in range(5)]
        bad = pool.submit(server.infer_v2, name, ["fine", ""])
    for index, future in enumerate(v2):
        answer = future.result().json()
        assert (answer["model_name"], answer["model_version"], answer["id"]) == (name, "1.0", f"req-{index}")
        (output,) = answer["outputs"]
        assert output["name"] == "embedding" and output["datatype"] == "FP32" and output["shape"] == [3, 384]
        got = torch.tensor(output["data"]).reshape(3, 384)
        assert min(torch.nn.functional.cosine_similarity(got, reference(texts)).tolist()) >= MIN_COSINE[name]
    assert all(len(future.result().json()) == 3 for future in plain)
    assert bad.result().status_code == 400 and "'inputs'[1] is empty" in bad.result().json()["error"]


def metric_values(text: str, name: str) -> dict[str, float]:
    pattern = re.compile(rf'^{name}{{ModelName="([^"]+)".*}} ([0-9.eE+-]+)$', re.MULTILINE)
    return {model: float(value) for model, value in pattern.findall(text)}


def test_custom_metrics_on_the_prometheus_endpoint(server):
    server.predict("minilm", {"inputs": TEXTS})  # at least one batch on each model
    server.predict("minilm32", {"inputs": TEXTS})
    text = server.metrics()
    for name in ("CompileSeconds", "WarmupSeconds", "PaddedTokenRatio"):
        values = metric_values(text, name)
        assert set(values) == {"minilm", "minilm32"} and min(values.values()) > 0, name
    assert metric_values(text, "RecompilesAfterReady") == {"minilm": 0.0, "minilm32": 0.0}
    for model in ("minilm", "minilm32"):  # served from packed rows
        assert re.search(rf'^BucketRequests{{ModelName="{model}".*Bucket="packed \d+x\d+"', text, re.MULTILINE)
    # The scheduled model's histograms: its calls' tokens, its requests' waits.
    assert metric_values(text, "CallKilotokens_count")["minilm"] >= 1
    assert (
        metric_values(text, "SchedulerQueueTime_count")["minilm"]
        >= metric_values(text, "CallKilotokens_count")["minilm"]
    )


def test_the_frontend_pid_names_torchserves_java_process(server):
    """benchmarks/benchmark_scheduler.py meters the frontend's CPU by this pid."""
    arguments = Path(f"/proc/{server.frontend_pid()}/cmdline").read_bytes().split(b"\0")
    assert Path(arguments[0].decode()).name == "java"
    assert any(b"ModelServer" in argument for argument in arguments)


def test_plain_torchserve_workers_keep_the_allocator_they_were_started_with_and_say_it(server):
    """TorchServe started as typed, without LD_PRELOAD: nothing in our archives restarts a worker, so
    each runs the allocator it was started with, and its log says which and how to get tcmalloc
    (handlers/runtime/allocator.py)."""
    frontend = Path(f"/proc/{server.frontend_pid()}/environ").read_bytes().split(b"\0")
    preloaded = os.environ.get("LD_PRELOAD")
    assert preloaded is not None or not any(entry.startswith(b"LD_PRELOAD=") for entry in frontend)
    expected = next((name for name in allocator.KNOWN if name in (preloaded or "")), "glibc")
    for name, _, _ in MODELS:
        for pid in server.worker_pids(name):
            assert allocator.in_use(Path(f"/proc/{pid}/maps")) == expected
    said = log_text(server.workdir)
    assert f"Memory allocator: {expected}" in said


def test_the_wheel_installs_one_package_of_its_own_name(wheel):
    (built,) = wheel.dist.glob("ts_compiled_handlers-*.whl")
    with zipfile.ZipFile(built) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    distribution, version = built.name.split("-")[:2]
    assert tops == {"ts_compiled_handlers", f"{distribution}-{version}.dist-info"}
    listed = wheel.python("-m", "pip", "show", "-f", "ts-compiled-handlers")
    assert "Location: " + str(wheel.site_packages) in listed and "License: Apache-2.0" in listed
    assert (
        "ts_compiled_handlers/scripts/cli.py" in listed
        and "ts_compiled_handlers/servers/torchserve/config.properties" in listed
    )
    assert "Editable project location" not in listed


def test_hfserve_start_and_register_serve_minilm_from_the_folder_and_write_nothing_into_the_package(
    server, wheel, installed_files, reference
):
    folder = server.workdir  # where init and build ran: config.properties, model_store/minilm.mar
    flags = [f"--{key.lower().replace('_', '-')}" for key in DEFAULT_PORTS]
    ports = [f"{flag}={port}" for flag, port in zip(flags, free_ports(len(flags)), strict=True)]
    wheel.hfserve("start", *ports, cwd=folder)
    try:
        wheel.hfserve("register", "minilm32.mar", cwd=folder)
        assert "minilm32" in wheel.hfserve("list", cwd=folder)
        started = TorchServe.attach(folder / "runs" / "server")
        answer = started.predict("minilm32", {"inputs": TEXTS[1]})
        assert min(cosines([answer.json()], reference(TEXTS[1:2]))) >= 0.9999
        assert (folder / "runs" / "server" / "key_file.json").is_file()  # the tokens stay in the folder
        copy = (folder / "runs" / "server" / "config.properties").read_text()
        assert "disable_token_authorization=false" in copy and str(folder / "metrics.yaml") in copy
        unauthorized = requests.post(f"{started.inference_url}/predictions/minilm32", json={"inputs": "x"}, timeout=30)
        assert unauthorized.status_code == 400 and "token" in unauthorized.text.lower()  # TorchServe: 400 without one
    finally:
        wheel.hfserve("stop", cwd=folder)
    assert wheel.files() == installed_files
