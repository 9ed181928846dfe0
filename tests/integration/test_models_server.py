"""The models users bring, through a real TorchServe: a 512-token embedder, a cross-encoder, a
decoder embedder with an instruction prompt; every answer against its reference library."""

import re

import pytest
import server_logs
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import AutoTokenizer

pytestmark = pytest.mark.integration

WORDS = "the cat sat on the red mat and alice walks to paris with bob".split()


def text_of(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def cosines(answers: list[dict], reference) -> list[float]:
    got = torch.tensor([answer["embedding"] for answer in answers])
    return torch.nn.functional.cosine_similarity(got, torch.as_tensor(reference), dim=1).tolist()


@pytest.fixture(scope="module")
def server(task_server):
    return task_server


def test_a_512_limit_embedder_answers_300_to_510_token_texts_as_sentence_transformers(server, tiny_models):
    folder = tiny_models["embedding-long"]
    reference = SentenceTransformer(str(folder), device="cpu")
    texts = [text_of(words) for words in (248, 300, 350, 415)]
    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(folder)(texts)["input_ids"]]
    assert min(lengths) >= 300 and max(lengths) <= 510, lengths
    response = server.predict("long-embedder", {"inputs": texts})
    assert response.status_code == 200 and response.headers["x-prompt-tokens"] == str(sum(lengths))
    assert min(cosines(response.json(), reference.encode(texts, normalize_embeddings=True))) >= 0.9999


def test_dimensions_truncate_and_truncation_direction(server, tiny_models):
    folder = tiny_models["embedding-long"]
    reference = SentenceTransformer(str(folder), device="cpu")
    texts = [text_of(40), text_of(300)]
    cut = server.predict("long-embedder", {"inputs": texts, "dimensions": 16}).json()
    assert [len(answer["embedding"]) for answer in cut] == [16, 16]
    wanted = reference.encode(texts, normalize_embeddings=True, truncate_dim=16)
    assert min(cosines(cut, wanted)) >= 0.9999
    refused = [
        server.predict("long-embedder", {"inputs": "x", "dimensions": 20}),  # not one of its Matryoshka sizes
        server.predict("long-embedder", {"inputs": "x", "dimensions": 64}),  # past the model's 32
        server.predict("long-embedder", {"inputs": text_of(700), "truncate": False}),
        server.predict("embedder", {"inputs": "x", "dimensions": 8}),  # not trained for it
    ]
    assert [response.status_code for response in refused] == [400, 400, 413, 400]
    assert all("dimensions" in response.json()["error"] for response in refused[:2] + refused[3:])
    # Left truncation keeps a long text's end: the same embedding as the tokenizer's own left cut.
    long = text_of(400) + " hello world green house by the blue river" * 40  # its two ends differ
    left = server.predict("long-embedder", {"inputs": long, "truncation_direction": "left"}).json()
    tokenizer = AutoTokenizer.from_pretrained(folder, truncation_side="left")
    kept = tokenizer.decode(tokenizer(long, truncation=True, max_length=512)["input_ids"], skip_special_tokens=True)
    assert cosines([left], reference.encode([kept], normalize_embeddings=True))[0] >= 0.9999
    right = server.predict("long-embedder", {"inputs": long}).json()
    assert cosines([left], torch.tensor([right["embedding"]]))[0] < 0.999  # a different end of the text


def test_a_cross_encoder_scores_pairs_and_reranks_as_crossencoder_predict(server, tiny_models):
    reference = CrossEncoder(str(tiny_models["cross-encoder"]), device="cpu")
    query = "where does alice walk"
    documents = ["alice walks to paris", "the cat sat on the mat", "bob runs to london with carol", "paris"]
    scores = reference.predict([(query, document) for document in documents]).tolist()
    body = {"query": query, "documents": documents, "top_n": 3, "return_documents": True}
    ranked = server.predict("reranker", body)
    assert ranked.status_code == 200
    best_first = sorted(range(len(documents)), key=lambda index: -scores[index])[:3]
    assert [item["index"] for item in ranked.json()] == best_first
    for item in ranked.json():
        assert item["score"] == pytest.approx(scores[item["index"]], abs=1e-4)
        assert item["document"] == documents[item["index"]]
    pairs = [{"text": query, "text_pair": document} for document in documents]
    labelled = server.predict("reranker", {"inputs": pairs}).json()
    assert [answer[0]["score"] for answer in labelled] == pytest.approx(scores, abs=1e-4)
    assert server.predict("embedder", {"query": query, "documents": documents}).status_code == 400


def test_a_decoder_embedder_pools_the_last_token_after_its_prompt_as_sentence_transformers(server, tiny_models):
    reference = SentenceTransformer(str(tiny_models["embedding-decoder"]), device="cpu")
    texts = ["where does alice walk", "the cat sat on the mat " * 4, "a"]
    query = server.predict("qwen-embedder", {"inputs": texts, "prompt_name": "query"}).json()
    plain = server.predict("qwen-embedder", {"inputs": texts}).json()
    assert min(cosines(query, reference.encode(texts, prompt_name="query"))) >= 0.9999
    assert min(cosines(plain, reference.encode(texts))) >= 0.9999
    bad = server.predict("qwen-embedder", {"inputs": "x", "prompt_name": "nope"})
    assert bad.status_code == 400 and "document, query" in bad.json()["error"]


def served_texts(metrics: str, name: str) -> float:
    """Texts the model served since it started (its BucketRequests counters added up)."""
    return sum(float(value) for value in re.findall(rf'BucketRequests{{.*ModelName="{name}".*}} (\S+)', metrics))


def test_the_new_paths_compile_nothing_after_ready(server):
    """Each model gets traffic of many lengths here, then reads 0 recompiles: not only its ready value."""
    texts = [text_of(words) for words in (1, 5, 20, 60, 130, 300)]
    before = server.metrics()
    bodies = {
        "long-embedder": {"inputs": texts},
        "reranker": {"query": "where", "documents": texts},
        "qwen-embedder": {"inputs": texts, "prompt_name": "query"},
    }
    for name, body in bodies.items():
        assert server.predict(name, body).status_code == 200, name

    def counted(text: str) -> bool:
        return all(served_texts(text, name) >= served_texts(before, name) + len(texts) for name in bodies)

    metrics = server_logs.metrics_after(server, counted)  # a worker's metrics may trail its answer
    for name in bodies:
        assert served_texts(metrics, name) >= served_texts(before, name) + len(texts), name
        values = re.findall(rf'RecompilesAfterReady{{.*ModelName="{name}".*}} (\S+)', metrics)
        assert values and all(float(value) == 0 for value in values), name
