"""Classification, token classification and generation archives through a real TorchServe on loopback."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from parity import assert_same_answers
from transformers import pipeline

pytestmark = pytest.mark.integration

TEXTS = ["alice walks to paris quickly", "the cat sat on the red mat in berlin", "Ünïcode bob, zzz!"]
PROMPTS = ["hello world, the cat", "alice walks to paris and bob runs to london with carol", "a", "the"]


@pytest.fixture(scope="module")
def server(task_server):
    return task_server


def concurrently(server, name, bodies) -> list[requests.Response]:
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(lambda body: server.predict(name, body), bodies))


def test_classification_matches_the_pipeline(server, tiny_models):
    reference = pipeline("text-classification", model=str(tiny_models["text-classification"]))
    bodies = [{"inputs": text, "top_k": None} for text in TEXTS] + [{"inputs": "x", "top_k": 0}]
    responses = concurrently(server, "classifier", bodies)
    assert [response.status_code for response in responses] == [200] * len(TEXTS) + [400]
    assert "top_k" in responses[-1].json()["error"]
    for text, response in zip(TEXTS, responses[:-1], strict=True):
        assert_same_answers(response.json(), reference(text, top_k=None))
    assert_same_answers(server.predict("classifier", {"inputs": TEXTS}).json(), reference(TEXTS, top_k=1))


@pytest.mark.parametrize("aggregation", ["none", "simple"])
def test_token_classification_matches_the_pipeline(server, tiny_models, aggregation):
    reference = pipeline("token-classification", model=str(tiny_models["token-classification"]))
    bodies = [{"inputs": TEXTS, "aggregation_strategy": aggregation}, {"inputs": ["x", ""]}]
    response, bad = concurrently(server, "tagger", bodies)
    assert response.status_code == 200 and bad.status_code == 400
    assert_same_answers(response.json(), reference(TEXTS, aggregation_strategy=aggregation))


def test_classification_answers_kserve_v2_like_its_own_json(server):
    expected = server.predict("classifier", {"inputs": TEXTS, "top_k": 2}).json()
    response = server.infer_v2("classifier", TEXTS, "abc", top_k=2)
    assert response.status_code == 200 and response.json()["id"] == "abc"
    labels, scores = response.json()["outputs"]
    assert (labels["name"], labels["datatype"], labels["shape"]) == ("label", "BYTES", [3, 2])
    assert (scores["name"], scores["datatype"], scores["shape"]) == ("score", "FP32", [3, 2])
    assert labels["data"] == [item["label"] for answer in expected for item in answer]
    assert scores["data"] == pytest.approx([item["score"] for answer in expected for item in answer])


def test_generation_of_a_mixed_batch_equals_generate_alone(server, generate):
    budgets = [12, 5, 16, 3]
    bodies = [{"inputs": prompt, "max_new_tokens": n} for prompt, n in zip(PROMPTS, budgets, strict=True)]
    bodies += [{"inputs": "a", "top_k": -1}, {"inputs": "a", "max_new_tokens": 10**9}]  # absurd, same batches
    responses = concurrently(server, "generator", bodies)
    assert [response.status_code for response in responses] == [200] * 4 + [400] * 2
    for prompt, n, response in zip(PROMPTS, budgets, responses[:4], strict=True):
        assert response.json()["generated_text"] == generate(prompt, n)
        assert response.json()["generated_tokens"] == n
    assert "top_k" in responses[4].json()["error"] and "max_new_tokens" in responses[5].json()["error"]


def stream(server, prompt: str, max_new_tokens: int) -> requests.Response:
    """A streamed generation request, its body still to be read."""
    return requests.post(
        f"{server.inference_url}/predictions/generator",
        data=json.dumps({"inputs": prompt, "max_new_tokens": max_new_tokens, "stream": True}),
        headers={**server.headers("inference"), "Content-Type": "application/json"},
        stream=True,
        timeout=120,
    )


def test_a_short_request_is_answered_while_a_long_one_runs(server, generate):
    """Continuous batching (the generation archive's default): the short request joins the running
    decode loop and leaves it first; both answers are the text `generate()` gives each alone."""
    long = stream(server, PROMPTS[1], 256)
    arrivals: list[tuple[float, bytes]] = []
    started = threading.Event()

    def read_long() -> None:
        for chunk in long.iter_content(chunk_size=None):
            arrivals.append((time.monotonic(), chunk))
            started.set()

    reader = threading.Thread(target=read_long)
    reader.start()
    assert started.wait(60)  # the long request is decoding
    short = server.predict("generator", {"inputs": PROMPTS[0], "max_new_tokens": 4})
    short_done = time.monotonic()
    reader.join(120)
    assert short.status_code == 200 and short.json()["generated_text"] == generate(PROMPTS[0], 4)
    assert arrivals[-1][0] > short_done, "the long request ended before the short one"
    summary = json.loads(b"".join(chunk for _, chunk in arrivals).decode().splitlines()[-1])
    assert summary["generated_tokens"] == 256 and summary["generated_text"] == generate(PROMPTS[1], 256)


def test_streaming_arrives_chunk_by_chunk(server, generate):
    response = stream(server, PROMPTS[0], 40)
    assert response.status_code == 200 and response.headers.get("Transfer-Encoding") == "chunked"
    chunks = [chunk for chunk in response.iter_content(chunk_size=None) if chunk]
    assert len(chunks) > 2, "tokens should arrive as separate chunks"
    lines = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
    summary = lines[-1]
    assert "".join(line["text"] for line in lines[:-1]) == summary["generated_text"] == generate(PROMPTS[0], 40)


def test_no_recompiles_after_ready(server):
    """Every task's archive gets traffic here, then reads 0 recompiles: not only its ready value."""
    long_text = " ".join(TEXTS * 6)
    for name, body in (
        ("classifier", {"inputs": [*TEXTS, long_text]}),
        ("tagger", {"inputs": [*TEXTS, long_text]}),
        ("embedder", {"inputs": [*TEXTS, long_text]}),
        ("generator", {"inputs": PROMPTS[:2], "max_new_tokens": 4}),
    ):
        assert server.predict(name, body).status_code == 200, name
    text = server.metrics()
    values = {
        line.split('ModelName="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("RecompilesAfterReady{")
    }
    # Other modules may have registered more archives on the shared server: every one must be at 0.
    assert {"embedder", "classifier", "tagger", "generator"} <= values.keys()
    assert set(values.values()) == {0.0}, values
