"""Sparse embeddings (SPLADE) and an LLM reranker (a Qwen3 causal LM) through a real TorchServe,
compiled and from AOT packages, against sentence-transformers' SparseEncoder and CrossEncoder."""

import re

import pytest
import requests
import torch
from sentence_transformers import CrossEncoder, SparseEncoder

pytestmark = pytest.mark.integration

WORDS = "the cat sat on the red mat and alice walks to paris with bob".split()
TEXTS = ["hello world", "the cat sat on the mat", "alice walks to paris and bob runs to london", "a"]
LONG_TEXTS = TEXTS + [" ".join(WORDS[i % len(WORDS)] for i in range(words)) for words in (20, 45)]
QUERY = "where does alice walk"
DOCUMENTS = ["alice walks to paris", "the cat sat on the mat", "bob runs to london with carol", "paris yes"]


@pytest.fixture(scope="module")
def server(task_server):
    return task_server


@pytest.fixture(scope="module")
def sparse_reference(tiny_models):
    return SparseEncoder(str(tiny_models["sparse-embedding"]), device="cpu")


@pytest.fixture(scope="module")
def rerank_scores(tiny_models) -> list[float]:
    model = CrossEncoder(str(tiny_models["reranker-causal"]), device="cpu")
    return model.predict([(QUERY, document) for document in DOCUMENTS]).tolist()


def assert_sparse_equal(answers: list[dict], reference: torch.Tensor) -> None:
    """Each answer has exactly the reference's non-zero indices, its values within 1e-4."""
    for answer, row in zip(answers, reference, strict=True):
        assert answer["indices"] == row.nonzero().squeeze(1).tolist()
        assert answer["values"] == pytest.approx(row[row > 0].tolist(), abs=1e-4)


def metric(metrics: str, name: str, model: str) -> list[float]:
    return [float(value) for value in re.findall(rf'{name}{{.*ModelName="{model}".*}} (\S+)', metrics)]


@pytest.mark.parametrize("name", ["sparse-embedder-aot", "sparse-embedder"])
def test_sparse_answers_equal_sparse_encoder_in_every_form(server, sparse_reference, name):
    texts = LONG_TEXTS if name.endswith("aot") else TEXTS  # the task archive's grid stops at 32 tokens
    reference = sparse_reference.encode(texts, convert_to_sparse_tensor=False)
    plain = server.predict(name, {"inputs": texts})
    assert plain.status_code == 200
    assert_sparse_equal(plain.json(), reference)
    single = server.predict(name, {"inputs": texts[0]}).json()
    assert_sparse_equal([single], reference[:1])
    tei = server.predict(f"{name}/1.0/embed_sparse", {"inputs": texts[:2]}).json()
    as_plain = [{"indices": [e["index"] for e in row], "values": [e["value"] for e in row]} for row in tei]
    assert_sparse_equal(as_plain, reference[:2])
    outputs = server.infer_v2(name, texts[:2]).json()["outputs"]
    assert [output["name"] for output in outputs] == ["indices", "values"]
    assert outputs[0]["datatype"] == "BYTES" and len(outputs[0]["data"]) == 2  # one JSON list per text
    assert '"indices"' not in outputs[0]["data"][0] and outputs[0]["data"][0].startswith("[")
    query = sparse_reference.encode_query(texts[:2], convert_to_sparse_tensor=False)
    assert_sparse_equal(server.predict(name, {"inputs": texts[:2], "prompt_name": "query"}).json(), query)


def test_top_k_and_threshold_keep_the_largest_values(server, sparse_reference):
    reference = sparse_reference.encode(TEXTS[1], convert_to_sparse_tensor=False)
    answer = server.predict("sparse-embedder", {"inputs": TEXTS[1], "top_k": 5}).json()
    assert len(answer["indices"]) == 5 and answer["indices"] == sorted(answer["indices"])
    assert sorted(answer["values"], reverse=True) == pytest.approx(reference.topk(5).values.tolist(), abs=1e-4)
    cut = reference.max().item() / 2
    kept = server.predict("sparse-embedder", {"inputs": TEXTS[1], "threshold": cut}).json()
    assert kept["indices"] == (reference > cut).nonzero().squeeze(1).tolist()
    bad = [{"top_k": 0}, {"threshold": -1}, {"normalize": True}, {"dimensions": 4}]
    statuses = [server.predict("sparse-embedder", {"inputs": "x", **params}).status_code for params in bad]
    assert statuses == [400, 400, 400, 400]
    info = requests.get(
        f"{server.inference_url}/predictions/sparse-embedder/1.0/info", headers=server.headers("inference"), timeout=10
    ).json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}


@pytest.mark.parametrize("name", ["llm-reranker", "llm-reranker-aot"])
def test_an_llm_reranker_scores_as_cross_encoder_in_every_rerank_form(server, rerank_scores, name):
    best_first = sorted(range(len(DOCUMENTS)), key=lambda index: -rerank_scores[index])
    ours = server.predict(name, {"query": QUERY, "documents": DOCUMENTS}).json()
    assert [item["index"] for item in ours] == best_first
    assert [item["score"] for item in ours] == pytest.approx([rerank_scores[i] for i in best_first], abs=1e-4)
    cohere = server.predict(f"{name}/1.0/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()
    assert [item["index"] for item in cohere["results"]] == best_first[:2]
    tei = server.predict(f"{name}/1.0/rerank", {"query": QUERY, "texts": DOCUMENTS}).json()
    assert [item["index"] for item in tei] == best_first
    assert [item["score"] for item in tei] == pytest.approx([rerank_scores[i] for i in best_first], abs=1e-4)
    pairs = [{"text": QUERY, "text_pair": document} for document in DOCUMENTS]
    labelled = server.predict(name, {"inputs": pairs}).json()
    assert [answer[0]["score"] for answer in labelled] == pytest.approx(rerank_scores, abs=1e-4)


def test_both_serve_without_recompiling_and_the_aot_archives_from_their_packages(server):
    texts = [" ".join(WORDS[i % len(WORDS)] for i in range(words)) for words in (1, 3, 9, 20, 40)]
    bodies = {
        "sparse-embedder": {"inputs": texts},
        "sparse-embedder-aot": {"inputs": texts},
        "llm-reranker": {"query": QUERY, "documents": texts},
        "llm-reranker-aot": {"query": QUERY, "documents": texts},
    }
    for name, body in bodies.items():
        assert server.predict(name, body).status_code == 200, name
    metrics = server.metrics()
    for name in bodies:
        recompiles = metric(metrics, "RecompilesAfterReady", name)
        assert recompiles and all(value == 0 for value in recompiles), name
    assert metric(metrics, "AotPackage", "sparse-embedder-aot") == [1]
    assert metric(metrics, "AotPackage", "llm-reranker-aot") == [1]
    assert metric(metrics, "AotPackage", "llm-reranker") == [0]
