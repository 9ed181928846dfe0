"""The MiniLM archive through a real TorchServe (Java), started the way the README's plain path does:

    torchserve --start --ncs --ts-config config.properties --model-store model_store --models minilm=minilm.mar

from a folder laid out like the repository (its config.properties as it is, model_store/,
handlers/metrics.yaml), with the ports moved only if TorchServe's usual ones are busy.
"""

import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from scripts.build_mar import build
from scripts.serve import DEFAULT_PORTS, TorchServe, busy, free_ports, port_settings, with_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "hello world",
    "TorchServe answers embedding requests from a compiled model.",
    "Die Katze schläft auf dem Sofa, und der Hund bellt. 猫はソファで寝ています。",
    "word " * 400,  # longer than the largest bucket: truncated at 256 tokens, as encode does
]
# (model name, extra model-config, minimum cosine to sentence-transformers' float32 encode)
BATCHING = {"batchSize": 8, "maxBatchDelay": 20}
MODELS = [("minilm32", {**BATCHING, "handler": {"dtype": "float32"}}, 0.9999), ("minilm", BATCHING, 0.999)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("repo_layout")
    for name, extra, _ in MODELS:
        build(minilm_dir, "embedding", name, root / "model_store", extra)
    (root / "handlers").mkdir()
    shutil.copy(ROOT / "handlers" / "metrics.yaml", root / "handlers")
    config = (ROOT / "config.properties").read_text()
    ports = DEFAULT_PORTS
    if any(busy(port) for port in ports.values()):
        ports = dict(zip(DEFAULT_PORTS, free_ports(len(DEFAULT_PORTS)), strict=True))
        config = with_settings(config, port_settings(ports))
    (root / "config.properties").write_text(config)
    torchserve = TorchServe(root, root / "model_store", ports)
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


def test_fifty_concurrent_requests_are_all_answered_correctly(server, reference):
    texts = [f"request number {i}: " + "tokens " * (i * 5 % 120) for i in range(50)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        responses = list(pool.map(lambda text: server.predict("minilm32", {"inputs": text}), texts))
    assert [response.status_code for response in responses] == [200] * 50
    assert min(cosines([r.json() for r in responses], reference(texts))) >= 0.9999


def test_a_bad_request_in_a_busy_batch_gets_its_4xx_and_the_others_200(server):
    bodies = [{"inputs": f"good request {i}"} for i in range(15)]
    bodies[7] = b'{"inputs": '  # invalid JSON
    bodies[11] = {"inputs": ["fine", 3]}  # a list with a non-string
    with ThreadPoolExecutor(max_workers=15) as pool:
        responses = list(pool.map(lambda body: server.predict("minilm32", body), bodies))
    codes = [response.status_code for response in responses]
    assert codes == [200] * 7 + [400] + [200] * 3 + [400] + [200] * 3
    assert responses[7].json()["code"] == 400 and "not valid JSON" in responses[7].json()["error"]
    assert "'inputs'[1] is not a string" in responses[11].json()["error"]
    assert server.ping().status_code == 200


def test_kserve_v2_requests_share_batches_with_plain_ones_and_get_their_own_answers(server, reference):
    texts = TEXTS[:3]
    with ThreadPoolExecutor(max_workers=12) as pool:
        v2 = [pool.submit(server.infer_v2, "minilm32", texts, f"req-{i}") for i in range(5)]
        plain = [pool.submit(server.predict, "minilm32", {"inputs": texts}) for _ in range(5)]
        bad = pool.submit(server.infer_v2, "minilm32", ["fine", ""])
    for index, future in enumerate(v2):
        answer = future.result().json()
        assert (answer["model_name"], answer["model_version"], answer["id"]) == ("minilm32", "1.0", f"req-{index}")
        (output,) = answer["outputs"]
        assert output["name"] == "embedding" and output["datatype"] == "FP32" and output["shape"] == [3, 384]
        got = torch.tensor(output["data"]).reshape(3, 384)
        assert min(torch.nn.functional.cosine_similarity(got, reference(texts)).tolist()) >= 0.9999
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
