"""A bge-m3 archive through a real TorchServe: the three outputs of one pass equal to
FlagEmbedding's `encode`, the rerank scores to its `compute_score` (tests/data/flag_m3.json), TEI's
`embed_sparse` route; a request asking for no output refused alone."""

import pytest
from flag_reference import REFERENCE, assert_equal_outputs

pytestmark = pytest.mark.integration


def test_bge_m3_answers_as_flag_embedding_on_our_body_and_tei_s_routes(task_server):
    every = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    answered = task_server.predict("m3", {"inputs": REFERENCE["texts"], **every})
    assert answered.status_code == 200
    assert_equal_outputs(answered.json())
    sparse = task_server.predict("m3/1.0/embed_sparse", {"inputs": REFERENCE["texts"][:2]}).json()
    for entries, weights in zip(sparse, REFERENCE["lexical_weights"][:2], strict=True):
        assert {str(entry["index"]): entry["value"] for entry in entries} == pytest.approx(weights, abs=1e-4)


def test_bge_m3_reranks_as_compute_score_and_refuses_a_body_that_asks_for_nothing(task_server):
    body = {"query": REFERENCE["query"], "documents": REFERENCE["texts"], "weights": REFERENCE["weights"]}
    ranked = task_server.predict("m3/1.0/rerank", body).json()
    scores = [score["colbert+sparse+dense"] for score in REFERENCE["scores"]]
    assert [one["index"] for one in ranked] == sorted(range(len(scores)), key=lambda index: -scores[index])
    assert [one["score"] for one in ranked] == pytest.approx([scores[one["index"]] for one in ranked], abs=1e-4)
    refused = task_server.predict("m3", {"inputs": "a", "return_dense": False})
    assert refused.status_code == 400 and "return_dense" in refused.json()["error"]
