"""OpenAI's API, Cohere's v2 embed and the rerank endpoints through a real TorchServe, spoken by
the real `openai` and `cohere` clients (and LangChain's OpenAI embeddings class), every answer
against its reference library."""

import json
import zipfile

import cohere
import numpy as np
import openai
import pytest
import requests
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers.util import quantize_embeddings
from transformers import AutoTokenizer

pytestmark = pytest.mark.integration

TEXTS = ["alice walks to paris quickly", "the cat sat on the red mat in berlin", "Ünïcode bob, zzz!"]


@pytest.fixture(scope="module")
def server(task_server):
    return task_server


def client(server, name: str) -> openai.OpenAI:
    """The client as a user writes it: the archive's path as base_url, the inference key as api_key."""
    return openai.OpenAI(
        base_url=f"{server.inference_url}/predictions/{name}/1.0/v1", api_key=server.key("inference"), max_retries=0
    )


def cosines(got, wanted) -> list[float]:
    return torch.nn.functional.cosine_similarity(torch.tensor(got), torch.as_tensor(wanted), dim=1).tolist()


def test_embeddings_equal_sentence_transformers_in_base64_and_float(server, tiny_models):
    reference = SentenceTransformer(str(tiny_models["embedding"]), device="cpu").encode(TEXTS)
    embedder = client(server, "embedder")
    packed = embedder.embeddings.create(model="embedder", input=TEXTS)  # the client asks for base64
    floats = embedder.embeddings.create(model="embedder", input=TEXTS, encoding_format="float")
    got = [item.embedding for item in packed.data]
    assert [item.index for item in packed.data] == [0, 1, 2] and min(cosines(got, reference)) >= 0.9999
    assert torch.equal(torch.tensor(got), torch.tensor([item.embedding for item in floats.data]))
    tokens = sum(len(ids) for ids in AutoTokenizer.from_pretrained(tiny_models["embedding"])(TEXTS)["input_ids"])
    assert packed.usage.prompt_tokens == packed.usage.total_tokens == tokens and packed.model == "embedder"
    one = embedder.embeddings.create(model="embedder", input=TEXTS[0], encoding_format="float")
    assert len(one.data) == 1 and one.data[0].embedding == floats.data[0].embedding


def test_token_id_inputs_are_the_models_input_as_sent(server, tiny_models):
    ids = AutoTokenizer.from_pretrained(tiny_models["embedding"])(TEXTS)["input_ids"]
    embedder = client(server, "embedder")
    by_text = embedder.embeddings.create(model="embedder", input=TEXTS, encoding_format="float")
    by_ids = embedder.embeddings.create(model="embedder", input=ids, encoding_format="float")
    by_one = embedder.embeddings.create(model="embedder", input=ids[1], encoding_format="float")
    assert min(cosines([d.embedding for d in by_ids.data], [d.embedding for d in by_text.data])) >= 0.99999
    assert min(cosines([by_one.data[0].embedding], [by_text.data[1].embedding])) >= 0.99999
    with pytest.raises(openai.BadRequestError) as refused:
        embedder.embeddings.create(model="embedder", input=[[1, 10**9]])
    assert "vocabulary" in refused.value.body["message"]


def test_dimensions_equal_sentence_transformers_truncate_dim(server, tiny_models):
    folder = tiny_models["embedding-long"]
    wanted = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, truncate_dim=16, normalize_embeddings=True)
    answer = client(server, "long-embedder").embeddings.create(model="long-embedder", input=TEXTS, dimensions=16)
    got = [item.embedding for item in answer.data]
    assert {len(vector) for vector in got} == {16} and min(cosines(got, wanted)) >= 0.9999


def test_models_lists_the_archive(server):
    assert [model.id for model in client(server, "embedder").models.list()] == ["embedder"]
    assert [model.id for model in client(server, "generator").models.list()] == ["generator"]


def test_an_unknown_model_and_a_bad_parameter_get_openais_error_shape(server):
    embedder = client(server, "embedder")
    with pytest.raises(openai.NotFoundError) as unknown:
        embedder.embeddings.create(model="gpt-4", input="x")
    with pytest.raises(openai.BadRequestError) as bad:
        embedder.embeddings.create(model="embedder", input="x", encoding_format="bits")
    with pytest.raises(openai.BadRequestError) as unserved:
        client(server, "generator").chat.completions.create(
            model="generator", messages=[{"role": "user", "content": "hi"}], logprobs=True
        )
    bodies = [unknown.value.body, bad.value.body, unserved.value.body]
    assert all(set(body) == {"message", "type", "param", "code"} for body in bodies)
    assert (bodies[0]["code"], bodies[0]["type"]) == ("model_not_found", "not_found_error")
    assert [body["param"] for body in bodies] == ["model", "encoding_format", "logprobs"]
    assert "gpt-4" not in bodies[0]["message"]  # nothing a request sends is echoed back


def test_a_completion_equals_generate(server, generate):
    answer = client(server, "generator").completions.create(
        model="generator", prompt="hello world, the cat", max_tokens=12, temperature=0
    )
    (choice,) = answer.choices
    assert choice.text == generate("hello world, the cat", 12) and choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 12 and answer.object == "text_completion"


def test_a_streamed_chat_completion_arrives_in_chunks_and_equals_generate(server, generate):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}]
    stream = client(server, "generator").chat.completions.create(
        model="generator",
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.content) > 2
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == generate("system: be brief\nuser: the cat\nassistant:", 24)
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == ["length"] and chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices


def test_the_stream_is_server_sent_events_ending_with_done(server):
    response = requests.post(
        f"{server.inference_url}/predictions/generator/1.0/v1/completions",
        json={"model": "generator", "prompt": "the", "max_tokens": 6, "temperature": 0, "stream": True},
        headers=server.headers("inference"),
        stream=True,
        timeout=120,
    )
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert all(event.startswith("data: ") for event in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "text_completion"


def test_rerank_scores_equal_cross_encoder_in_cohere_and_tei_shapes(server, tiny_models):
    query, documents = "where does alice walk", TEXTS + ["alice walks to paris"]
    scores = CrossEncoder(str(tiny_models["cross-encoder"]), device="cpu").predict([(query, d) for d in documents])
    order = sorted(range(len(documents)), key=lambda index: -scores[index])
    body = {"model": "reranker", "query": query, "documents": documents, "top_n": 3, "return_documents": True}
    url = f"{server.inference_url}/predictions/reranker/1.0"
    cohere = requests.post(f"{url}/v1/rerank", json=body, headers=server.headers("inference"), timeout=60).json()
    assert [result["index"] for result in cohere["results"]] == order[:3]
    assert [result["document"]["text"] for result in cohere["results"]] == [documents[i] for i in order[:3]]
    assert [r["relevance_score"] for r in cohere["results"]] == pytest.approx([scores[i] for i in order[:3]], abs=1e-4)
    del body["model"]
    tei = requests.post(f"{url}/rerank", json=body, headers=server.headers("inference"), timeout=60).json()
    assert [(r["index"], r["document"]) for r in tei] == [(i, documents[i]) for i in order[:3]]
    refused = requests.post(f"{url}/v1/rerank", json={"query": "q"}, headers=server.headers("inference"), timeout=60)
    assert refused.status_code == 400 and set(refused.json()["error"]) == {"message", "type", "param", "code"}


def test_cohere_v2_embed_answers_each_type_as_quantize_embeddings_with_the_archive_ranges(server, tiny_models):
    """The real `cohere` client (its ClientV2, as a user points it at the archive's path) parses
    every embedding type; int8/uint8 use the ranges `hfserve build` put in the archive."""
    client = cohere.ClientV2(
        api_key=server.key("inference"), base_url=f"{server.inference_url}/predictions/embedder/1.0", timeout=60
    )
    types = ["float", "int8", "uint8", "binary", "ubinary"]
    response = client.embed(texts=TEXTS, model="embedder", input_type="search_query", embedding_types=types)
    floats = np.array(response.embeddings.float_, dtype=np.float32)
    reference = SentenceTransformer(str(tiny_models["embedding"]), device="cpu").encode(TEXTS)
    assert min(cosines(floats, reference)) >= 0.9999
    saved = json.loads(zipfile.ZipFile(server.model_store / "embedder.mar").read("answer_ranges.json"))
    ranges = np.array([saved["min"], saved["max"]], dtype=np.float32)
    for kind in types[1:]:
        wanted = quantize_embeddings(floats, kind, ranges=ranges)
        assert np.array_equal(np.array(getattr(response.embeddings, kind)), wanted), kind
    assert response.texts == TEXTS and response.meta.billed_units.input_tokens > 0
    with pytest.raises(cohere.core.api_error.ApiError) as refused:
        client.embed(texts=TEXTS, model="embedder", input_type="poetry", embedding_types=["float"])
    assert refused.value.status_code == 400 and "input_type" in refused.value.body["message"]


def test_langchain_openai_embeddings_work_offline(server, tiny_models):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model="embedder",
        base_url=f"{server.inference_url}/predictions/embedder/1.0/v1",
        api_key=server.key("inference"),
        check_embedding_ctx_length=False,  # else it fetches tiktoken's vocabulary from the network
        max_retries=0,
    )
    reference = SentenceTransformer(str(tiny_models["embedding"]), device="cpu")
    assert min(cosines(embeddings.embed_documents(TEXTS), reference.encode(TEXTS))) >= 0.9999
    assert min(cosines([embeddings.embed_query(TEXTS[0])], reference.encode(TEXTS[:1]))) >= 0.9999
