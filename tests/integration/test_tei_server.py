"""TEI's API through a real TorchServe: spoken by the real clients written for TEI (huggingface_hub's
InferenceClient, LangChain's HuggingFaceEndpointEmbeddings) with the archive's path as the URL,
and in TEI's own bodies; every answer against sentence-transformers, CrossEncoder or the pipeline."""

import pytest
import requests
import torch
from huggingface_hub import InferenceClient
from langchain_huggingface import HuggingFaceEndpointEmbeddings
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import AutoTokenizer, pipeline

pytestmark = pytest.mark.integration

TEXTS = ["alice walks to paris quickly", "the cat sat on the red mat in berlin", "Ünïcode bob, zzz!"]


@pytest.fixture(scope="module")
def server(task_server):
    return task_server


def base(server, name: str) -> str:
    return f"{server.inference_url}/predictions/{name}/1.0"


def post(server, name: str, route: str, body) -> requests.Response:
    headers = server.headers("inference")
    return requests.post(f"{base(server, name)}/{route}", json=body, headers=headers, timeout=60)


def cosines(got, wanted) -> list[float]:
    return torch.nn.functional.cosine_similarity(torch.as_tensor(got), torch.as_tensor(wanted), dim=1).tolist()


def test_huggingface_hubs_client_and_langchain_embed_as_sentence_transformers(server, tiny_models):
    reference = SentenceTransformer(str(tiny_models["embedding"]), device="cpu").encode(TEXTS)
    key = server.key("inference")
    client = InferenceClient(token=key)
    vectors = client.feature_extraction(TEXTS, model=f"{base(server, 'embedder')}/embed")
    assert vectors.shape == reference.shape and min(cosines(vectors, reference)) >= 0.9999
    one = client.feature_extraction(TEXTS[0], model=f"{base(server, 'embedder')}/embed", normalize=False)
    assert one.shape == (1, reference.shape[1]) and min(cosines(one, reference[:1])) >= 0.9999
    embeddings = HuggingFaceEndpointEmbeddings(model=f"{base(server, 'embedder')}/embed", huggingfacehub_api_token=key)
    assert min(cosines(embeddings.embed_documents(TEXTS), reference)) >= 0.9999
    assert min(cosines([embeddings.embed_query(TEXTS[1])], reference[1:2])) >= 0.9999


def test_the_hub_clients_text_classification_gets_the_pipelines_best_label(server, tiny_models):
    classify = pipeline("text-classification", model=str(tiny_models["text-classification"]), device="cpu")
    client = InferenceClient(token=server.key("inference"))
    got = client.text_classification(TEXTS[0], model=f"{base(server, 'classifier')}/predict")
    expected = classify(TEXTS[0], top_k=None)
    assert got.label == expected[0]["label"] and got.score == pytest.approx(expected[0]["score"], abs=1e-4)
    batch = post(server, "classifier", "predict", {"inputs": TEXTS, "raw_scores": False})
    assert batch.status_code == 200
    for answer, wanted in zip(batch.json(), classify(TEXTS, top_k=None), strict=True):
        assert [item["label"] for item in answer] == [item["label"] for item in wanted]
        assert [item["score"] for item in answer] == pytest.approx([item["score"] for item in wanted], abs=1e-4)


def test_teis_rerank_body_ranks_as_crossencoder(server, tiny_models):
    model = CrossEncoder(str(tiny_models["cross-encoder"]), device="cpu")
    query, texts = "where does alice walk", TEXTS
    scores = model.predict([(query, text) for text in texts])
    answer = post(server, "reranker", "rerank", {"query": query, "texts": texts, "return_text": True})
    assert answer.status_code == 200, answer.text
    order = sorted(range(len(texts)), key=lambda index: -scores[index])
    assert [item["index"] for item in answer.json()] == order
    assert [item["text"] for item in answer.json()] == [texts[index] for index in order]
    assert [item["score"] for item in answer.json()] == pytest.approx([float(scores[i]) for i in order], abs=1e-4)
    raw = post(server, "reranker", "rerank", {"query": query, "texts": texts, "raw_scores": True}).json()
    logits = model.predict([(query, text) for text in texts], activation_fn=torch.nn.Identity())
    assert [item["score"] for item in raw] == pytest.approx([float(logits[i]) for i in order], abs=1e-4)
    assert "text" not in raw[0]
    ours = post(server, "reranker", "rerank", {"query": query, "documents": texts})  # our body still works
    assert [item["index"] for item in ours.json()] == order


def test_tokenize_decode_and_info_need_no_model_call(server, tiny_models):
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["embedding"])
    tokens = post(server, "embedder", "tokenize", {"inputs": [TEXTS[0], TEXTS[2]]})
    assert tokens.status_code == 200
    for text, answer in zip([TEXTS[0], TEXTS[2]], tokens.json(), strict=True):
        assert [token["id"] for token in answer] == tokenizer(text)["input_ids"]
        assert answer[0]["special"] and answer[-1]["special"]  # [CLS] ... [SEP]
        assert all(text[token["start"] : token["stop"]] == token["text"] for token in answer if not token["special"])
    ids = tokenizer(TEXTS[1])["input_ids"]
    decoded = post(server, "embedder", "decode", {"ids": ids, "skip_special_tokens": True})
    assert decoded.json() == [tokenizer.decode(ids, skip_special_tokens=True)]
    info = requests.get(f"{base(server, 'embedder')}/info", headers=server.headers("inference"), timeout=10).json()
    assert info["model_id"] == "embedder" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 32 and info["max_client_batch_size"] >= 1 and info["version"]
    reranker = requests.get(f"{base(server, 'reranker')}/info", headers=server.headers("inference"), timeout=10)
    assert list(reranker.json()["model_type"]) == ["reranker"]


def test_refusals_have_teis_shape_and_fail_alone(server):
    bad = post(server, "embedder", "embed", {"inputs": 3})
    assert bad.status_code == 422 and bad.json() == {
        "error": "'inputs' must be a string or a list of strings",
        "error_type": "Validation",
    }
    unknown = post(server, "embedder", "embed", {"inputs": "a", "parameters": {"colour": "red"}})
    assert unknown.status_code == 400 and unknown.json()["error_type"] == "Validation"
    assert "red" not in unknown.text  # never echoed
    decode = post(server, "embedder", "decode", {"ids": [10**9]})
    assert decode.status_code == 422 and decode.json()["error_type"] == "Validation"
    assert post(server, "embedder", "embed", {"inputs": "still fine"}).status_code == 200
