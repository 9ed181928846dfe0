"""LoRA adapters through a real TorchServe: the task server's archives with two adapters each
(tests/archives.py's LORA_ARCHIVES), answers held to PEFT's merged models in batches that mix the
adapters and the base model."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import server_logs
import torch
from lora_reference import QUERY, TEXTS, cosine_at_least

pytestmark = pytest.mark.integration

MIX = ["one", None, "two", "one", None, "two"]  # concurrent, so TorchServe batches them together


def with_adapter(body: dict, name: str | None) -> dict:
    return {**body, "adapter": name} if name else body


def concurrently(server, name: str, bodies: list, route: str = "") -> list:
    path = f"{name}/1.0/{route}" if route else name
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: server.predict(path, body), bodies))


def test_a_compiled_embedder_answers_each_adapter_as_peft_merged_it_with_no_recompile(task_server, lora_models):
    _, _, expected = lora_models["embedder"]
    responses = concurrently(task_server, "lora-embedder", [with_adapter({"inputs": TEXTS}, name) for name in MIX])
    assert [response.status_code for response in responses] == [200] * len(MIX)
    for name, response in zip(MIX, responses, strict=True):
        got = torch.tensor([item["embedding"] for item in response.json()])
        assert cosine_at_least(got, expected[name]) >= 0.9999, name
    named = task_server.predict("lora-embedder/1.0/v1/embeddings", {"model": "lora-embedder:two", "input": TEXTS})
    got = torch.tensor([item["embedding"] for item in named.json()["data"]])
    assert named.status_code == 200 and cosine_at_least(got, expected["two"]) >= 0.9999
    unknown = task_server.predict("lora-embedder", {"inputs": "hello", "adapter": "three"})
    assert unknown.status_code == 400 and "one, two" in unknown.json()["error"]

    def recompiles(text: str) -> list[float]:
        return [
            float(value) for value in re.findall(r'RecompilesAfterReady{.*ModelName="lora-embedder".*} (\S+)', text)
        ]

    metrics = server_logs.metrics_after(task_server, lambda text: bool(recompiles(text)))
    assert recompiles(metrics) and all(value == 0 for value in recompiles(metrics))


def test_a_cross_encoder_scores_each_adapter_as_peft_merged_it(task_server, lora_models):
    _, _, scores = lora_models["ranker"]
    bodies = [with_adapter({"query": QUERY, "documents": TEXTS}, name) for name in MIX]
    responses = concurrently(task_server, "lora-ranker", bodies, "rerank")
    assert [response.status_code for response in responses] == [200] * len(MIX)
    for name, response in zip(MIX, responses, strict=True):
        got = {item["index"]: item["score"] for item in response.json()}
        assert [got[index] for index in range(len(TEXTS))] == pytest.approx(scores[name], abs=1e-4), name
