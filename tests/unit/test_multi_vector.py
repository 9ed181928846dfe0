"""Multi-vector (ColBERT) archives: every token vector equal to PyLate's `encode` for queries and
documents, MaxSim reranking equal to PyLate's scores, compiled (packed and padded) and from an AOT
package, nothing recompiled after ready; bad input refused for that request only. PyLate's answers
are kept in tests/data/pylate_colbert.json (tests/pylate_reference.py)."""

import json
import shutil

import pytest
from fakes import build_aot_package, ready_handler
from pylate_reference import REFERENCE, assert_equal_vectors, checked_model
from rerank_shapes import (
    assert_bad_bodies_are_refused_alone,
    assert_cohere_clients_read_the_ranking,
    assert_every_shape_ranks_as_rerank,
)
from test_adapters import ask

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.graphs.late_interaction import ColbertSettings
from ts_compiled_handlers.scripts.task_inference import infer_task

GRID = {"seq_lens": [16, 48], "batch_sizes": [1, 4]}


@pytest.fixture(scope="module")
def colbert_dir(tiny_models):
    return checked_model(tiny_models["colbert"])


@pytest.fixture(scope="module", params=["auto", "off"], ids=["packed", "padded"])
def handler(colbert_dir, request):
    return ready_handler("multi-vector", colbert_dir, buckets={**GRID, "pack_tokens": request.param})


def test_query_and_document_vectors_equal_pylate_and_nothing_recompiles(handler):
    assert handler.engine.model.is_compiled
    bodies = [
        {"inputs": REFERENCE["queries"], "input_type": "query"},
        {"inputs": REFERENCE["documents"], "input_type": "document"},
    ]
    queries, documents = ask(handler, bodies)
    assert_equal_vectors([answer["embedding"] for answer in queries], REFERENCE["query_vectors"])
    assert_equal_vectors([answer["embedding"] for answer in documents], REFERENCE["document_vectors"])
    lengths = [
        {"inputs": "word " * count, "input_type": kind} for count in (1, 9, 30, 60) for kind in ("query", "document")
    ]
    answers = ask(handler, lengths)
    assert [len(answer["embedding"]) for answer in answers[::2]] == [16] * 4  # queries: always the query length
    assert handler.engine.model.recompiles_after_ready == 0


def test_maxsim_rerank_scores_equal_pylate_in_the_same_order(handler):
    for query, scores in zip(REFERENCE["queries"], REFERENCE["maxsim"], strict=True):
        body = {"query": query, "documents": REFERENCE["documents"], "return_documents": True}
        (ranked,) = ask(handler, [body], ["rerank"])
        assert [one["index"] for one in ranked] == sorted(range(len(scores)), key=lambda index: -scores[index])
        for one in ranked:
            assert one["score"] == pytest.approx(scores[one["index"]], abs=1e-4)
            assert one["document"] == REFERENCE["documents"][one["index"]]
    (top,) = ask(handler, [{"query": REFERENCE["queries"][0], "documents": REFERENCE["documents"], "top_n": 1}])
    assert len(top) == 1 and "document" not in top[0]


def test_every_rerank_shape_answers_the_maxsim_scores_as_a_cross_encoder_answers_its_own(handler):
    """TEI's `rerank`, Cohere's and Jina's `v1/rerank`, Cohere's `v2/rerank` (and its client) on ColBERT."""
    query, documents = REFERENCE["queries"][1], REFERENCE["documents"]
    scores = assert_every_shape_ranks_as_rerank(handler, query, documents, {})
    assert [scores[index] for index in range(len(documents))] == pytest.approx(REFERENCE["maxsim"][1], abs=1e-4)
    assert_cohere_clients_read_the_ranking(handler, query, documents, {}, scores)
    assert_bad_bodies_are_refused_alone(handler, query, documents)


def test_openai_and_cohere_routes_take_the_input_type(handler):
    texts = REFERENCE["queries"][:2]
    openai, cohere = ask(
        handler,
        [{"input": texts, "model": "test", "input_type": "query"}, {"texts": texts, "input_type": "search_query"}],
        ["v1/embeddings", "v2/embed"],
    )
    assert_equal_vectors([item["embedding"] for item in openai["data"]], REFERENCE["query_vectors"][:2])
    assert_equal_vectors(cohere["embeddings"]["float"], REFERENCE["query_vectors"][:2])
    (documents,) = ask(handler, [{"texts": REFERENCE["documents"], "input_type": "search_document"}], ["v2/embed"])
    assert_equal_vectors(documents["embeddings"]["float"], REFERENCE["document_vectors"])


@pytest.mark.parametrize(
    "body, route, field",
    [
        ({"inputs": "a"}, "", "input_type"),
        ({"inputs": "a", "input_type": "passage"}, "", "input_type"),
        ({"inputs": "a", "input_type": "query", "precision": "int8"}, "", "precision"),
        ({"inputs": "a", "input_type": "query", "normalize": False}, "", "allowed: "),  # names not echoed
        ({"inputs": "a", "input_type": "query", "truncation_direction": "left"}, "", "allowed: "),
        ({"query": "a", "documents": ["b"], "input_type": "query"}, "", "input_type"),
        ({"input": [[101, 102]], "model": "test", "input_type": "query"}, "v1/embeddings", "input"),
        ({"input": "a", "model": "test", "input_type": "query", "encoding_format": "base64"}, "v1/embeddings", None),
        ({"texts": ["a"], "input_type": "search_query", "embedding_types": ["int8"]}, "v2/embed", None),
        ({"texts": ["a"], "input_type": "search_document", "truncate": "START"}, "v2/embed", "truncate"),  # cuts [D]
    ],
)
def test_bad_input_gets_a_400_naming_it_and_its_batch_mate_is_answered(handler, body, route, field):
    refused, answered = ask(handler, [body, {"inputs": ["b"], "input_type": "document"}], [route, ""])
    assert handler.context.get_response_status(0)[0] == 400
    message = json.dumps(refused)
    assert field is None or field in message
    assert handler.context.get_response_status(1)[0] == 200 and len(answered[0]["embedding"]) == 4  # [CLS] [D] b [SEP]


def test_the_settings_cut_and_expand_queries_and_skip_punctuation(colbert_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(colbert_dir)
    saved = json.loads((colbert_dir / "config_sentence_transformers.json").read_text())
    settings = ColbertSettings.read(saved, tokenizer)
    mask, ids = tokenizer.mask_token_id, list(range(1000, 1030))
    assert settings.query_ids([101, 1, 7592, 102]) == [101, 1, 7592, 102] + [mask] * 12
    assert settings.query_ids(ids) == ids[:15] + ids[-1:]
    comma, period = tokenizer.convert_tokens_to_ids([",", "."])
    assert settings.kept_tokens([101, 2, 7592, comma, 2088, period, 102]) == [0, 1, 2, 4, 6]
    assert settings.unattended_id == mask
    assert infer_task(colbert_dir) == "multi-vector"


def test_an_aot_package_serves_the_same_vectors_and_scores_without_dynamo(colbert_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(colbert_dir, model)
    build_aot_package("multi-vector", model, {"handler": {"dtype": "float32", "buckets": GRID}})
    handler = ready_handler("multi-vector", model, buckets=GRID)
    assert handler.model_source == "aot package" and compiled_graph_count() == 0
    bodies = [
        {"inputs": REFERENCE["queries"], "input_type": "query"},
        {"inputs": REFERENCE["documents"], "input_type": "document"},
        {"query": REFERENCE["queries"][1], "documents": REFERENCE["documents"]},
    ]
    queries, documents, ranked = ask(handler, bodies)
    assert_equal_vectors([answer["embedding"] for answer in queries], REFERENCE["query_vectors"])
    assert_equal_vectors([answer["embedding"] for answer in documents], REFERENCE["document_vectors"])
    for one in ranked:
        assert one["score"] == pytest.approx(REFERENCE["maxsim"][1][one["index"]], abs=1e-4)
    assert compiled_graph_count() == 0 and handler.engine.model.recompiles_after_ready == 0
