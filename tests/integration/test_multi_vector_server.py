"""A ColBERT archive (multi-vector) through a real TorchServe: token vectors and MaxSim rerank
scores equal to PyLate's (tests/data/pylate_colbert.json), on our body, OpenAI's, Cohere's and
KServe v2's routes; a request without `input_type` refused alone."""

import json

import pytest
from pylate_reference import REFERENCE, assert_equal_vectors

pytestmark = pytest.mark.integration


def test_colbert_answers_as_pylate_on_every_route(task_server):
    queries, documents = REFERENCE["queries"], REFERENCE["documents"]
    plain = task_server.predict("colbert", {"inputs": queries, "input_type": "query"})
    assert plain.status_code == 200
    assert_equal_vectors([answer["embedding"] for answer in plain.json()], REFERENCE["query_vectors"])
    openai = task_server.predict("colbert/1.0/v1/embeddings", {"input": documents, "input_type": "document"})
    assert_equal_vectors([item["embedding"] for item in openai.json()["data"]], REFERENCE["document_vectors"])
    cohere = task_server.predict("colbert/1.0/v2/embed", {"texts": queries[:1], "input_type": "search_query"})
    assert_equal_vectors(cohere.json()["embeddings"]["float"], REFERENCE["query_vectors"][:1])
    ragged = [documents[0], documents[2]]  # 12 and 42 vectors: one JSON list of vectors per text
    (output,) = task_server.infer_v2("colbert", ragged, input_type="document").json()["outputs"]
    assert output["name"] == "embedding" and output["datatype"] == "BYTES"
    wanted = [REFERENCE["document_vectors"][0], REFERENCE["document_vectors"][2]]
    assert_equal_vectors([json.loads(row) for row in output["data"]], wanted)


def test_colbert_reranks_by_maxsim_as_pylate_and_refuses_a_text_without_input_type(task_server):
    body = {"query": REFERENCE["queries"][1], "documents": REFERENCE["documents"]}
    ranked = task_server.predict("colbert/1.0/rerank", body).json()
    scores = REFERENCE["maxsim"][1]
    assert [one["index"] for one in ranked] == sorted(range(len(scores)), key=lambda index: -scores[index])
    assert [one["score"] for one in ranked] == pytest.approx([scores[one["index"]] for one in ranked], abs=1e-4)
    refused = task_server.predict("colbert", {"inputs": "a"})
    assert refused.status_code == 400 and "input_type" in refused.json()["error"]
