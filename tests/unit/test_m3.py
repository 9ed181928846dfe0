"""bge-m3 archives: the dense vector, the lexical weights and the ColBERT vectors equal to
FlagEmbedding's `encode`, from one compiled pass (packed and padded) and from an AOT package,
reranking equal to its `compute_score`, TEI's `embed` and `embed_sparse`, nothing recompiled after
ready; bad input refused for that request only. FlagEmbedding's answers are kept in
tests/data/flag_m3.json (tests/flag_reference.py)."""

import dataclasses
import json
import shutil

import pytest
from fakes import build_aot_package, ready_handler
from flag_reference import REFERENCE, assert_close_vectors, assert_equal_outputs, checked_model
from pylate_reference import vectors
from rerank_shapes import (
    assert_bad_bodies_are_refused_alone,
    assert_cohere_clients_read_the_ranking,
    assert_every_shape_ranks_as_rerank,
)
from test_adapters import ask
from transformers import AutoTokenizer

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.scripts.task_inference import infer_task

GRID = {"seq_lens": [16, 128], "batch_sizes": [1, 4]}
EVERY_OUTPUT = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
DENSE, SPARSE, _ = REFERENCE["weights"]
# compute_score's five modes as `weights`: (dense, sparse, colbert)
MODES = {
    "dense": (1, 0, 0),
    "sparse": (0, 1, 0),
    "colbert": (0, 0, 1),
    "sparse+dense": (DENSE, SPARSE, 0),
    "colbert+sparse+dense": REFERENCE["weights"],
}


@pytest.fixture(scope="module")
def m3_dir(tiny_models):
    return checked_model(tiny_models["m3"])


@pytest.fixture(scope="module", params=["auto", "off"], ids=["packed", "padded"])
def handler(m3_dir, request):
    return ready_handler("m3-embedding", m3_dir, buckets={**GRID, "pack_tokens": request.param})


def test_the_three_outputs_equal_flag_embedding_and_nothing_recompiles(handler, m3_dir):
    assert handler.engine.model.is_compiled and infer_task(m3_dir) == "m3-embedding"
    (answers,) = ask(handler, [{"inputs": REFERENCE["texts"], **EVERY_OUTPUT}])
    assert_equal_outputs(answers)
    one_by_one = ask(handler, [{"inputs": text, **EVERY_OUTPUT} for text in REFERENCE["texts"]])
    assert_equal_outputs(one_by_one)
    (default,) = ask(handler, [{"inputs": REFERENCE["texts"][:2]}])
    assert [set(answer) for answer in default] == [{"dense_vecs"}] * 2  # FlagEmbedding's default: dense only
    texts = ["cat " * count for count in (1, 9, 30, 120)]
    lengths = ask(handler, [{"inputs": text, "return_colbert_vecs": True} for text in texts])
    tokens = [len(ids) for ids in AutoTokenizer.from_pretrained(m3_dir)(texts).input_ids]
    assert [len(answer["colbert_vecs"]) for answer in lengths] == [count - 1 for count in tokens]  # all but <s>
    assert handler.engine.model.recompiles_after_ready == 0


@pytest.mark.parametrize("mode", MODES)
def test_rerank_scores_equal_compute_score_in_the_same_order(handler, mode):
    scores = [score[mode] for score in REFERENCE["scores"]]
    body = {"query": REFERENCE["query"], "documents": REFERENCE["texts"], "weights": list(MODES[mode])}
    (ranked,) = ask(handler, [body])
    assert [one["index"] for one in ranked] == sorted(range(len(scores)), key=lambda index: -scores[index])
    for one in ranked:
        assert one["score"] == pytest.approx(scores[one["index"]], abs=1e-4)


def test_every_rerank_shape_answers_the_weighted_scores_as_a_cross_encoder_answers_its_own(handler):
    """TEI's `rerank`, Cohere's and Jina's `v1/rerank`, Cohere's `v2/rerank` (and its client), `weights` in each."""
    weights = {"weights": list(REFERENCE["weights"])}
    scores = assert_every_shape_ranks_as_rerank(handler, REFERENCE["query"], REFERENCE["texts"], weights)
    wanted = [score["colbert+sparse+dense"] for score in REFERENCE["scores"]]
    assert [scores[index] for index in range(len(wanted))] == pytest.approx(wanted, abs=1e-4)
    assert_cohere_clients_read_the_ranking(handler, REFERENCE["query"], REFERENCE["texts"], weights, scores)
    assert_bad_bodies_are_refused_alone(handler, REFERENCE["query"], REFERENCE["texts"])


def test_tei_embed_and_embed_sparse_answer_one_output_each(handler):
    dense, sparse = ask(handler, [{"inputs": REFERENCE["texts"]}] * 2, ["embed", "embed_sparse"])
    (normalized,) = ask(handler, [{"inputs": REFERENCE["texts"], "normalize": True}], ["embed"])  # TEI's default
    assert normalized == dense
    for got, wanted in zip(dense, vectors(REFERENCE["dense_vecs"]), strict=True):
        assert_close_vectors([got], wanted[None])
    for entries, weights in zip(sparse, REFERENCE["lexical_weights"], strict=True):
        assert [entry["index"] for entry in entries] == sorted(int(token) for token in weights)
        assert [entry["value"] for entry in entries] == pytest.approx(
            [weights[str(entry["index"])] for entry in entries], abs=1e-4
        )


@pytest.mark.parametrize(
    "body, route, field",
    [
        ({"inputs": "a", "return_dense": False}, "", "return_dense"),
        ({"inputs": "a", "return_sparse": "yes"}, "", "return_sparse"),
        ({"inputs": "a", "weights": [1, 1, 1]}, "", "weights"),
        ({"query": "a", "documents": ["b"], "return_sparse": True}, "", "weights"),
        ({"query": "a", "documents": ["b"], "weights": [1, 1]}, "", "weights"),
        ({"query": "a", "documents": ["b"], "weights": [0, 0, 0]}, "", "weights"),
        ({"query": "a", "documents": ["b"], "weights": [1, -1, 1]}, "", "weights"),
        ({"query": "a", "documents": ["b"], "weights": [1e308, 1e308, 1e308]}, "", "weights"),  # their sum overflows
        ({"inputs": "a", "normalize": False}, "embed", "must be true"),  # the dense vector is always normalized
        ({"inputs": "a", "dimensions": 8}, "", "allowed: "),  # names are not echoed
        ({"inputs": "a", "precision": "int8"}, "", "allowed: "),
        ({"inputs": [[0, 5, 2]]}, "", "inputs"),
    ],
)
def test_bad_input_gets_a_400_naming_it_and_its_batch_mate_is_answered(handler, body, route, field):
    refused, answered = ask(handler, [body, {"inputs": ["b"], "return_colbert_vecs": True}], [route, ""])
    assert handler.context.get_response_status(0)[0] == 400
    assert field in json.dumps(refused)
    assert handler.context.get_response_status(1)[0] == 200 and set(answered[0]) == {"dense_vecs", "colbert_vecs"}


def test_a_batch_holds_per_token_rows_within_max_held_bytes_and_answers_the_rest(handler, monkeypatch):
    """The rows a request holds follow from its tokens before it is queued (bge-m3's state, sparse
    weight and ColBERT vector per token, as the graph gives them): at `max_held_bytes` of 100
    tokens' rows, a request of more tokens is a 413 naming the option, the second of two that fit
    alone but not together a 503 (it fits later), and the others are answered."""
    task = handler.worker.task
    (row,) = handler.engine.run([[0, 5, 2]]).rows
    assert task.token_values == row.shape[-1]  # the count is the engine's own row width
    config = dataclasses.replace(task.config, max_held_bytes=100 * task.token_values * 4)
    monkeypatch.setattr(task, "config", config)
    texts = ["cat " * 120, "cat " * 60, "cat " * 60, "cat"]
    tokens = [len(ids) for ids in handler.worker.serving.tokenizer(texts).input_ids]
    assert tokens[0] > 100 and tokens[1] + tokens[3] <= 100 < tokens[1] * 2
    answers = ask(handler, [{"inputs": text, "return_colbert_vecs": True} for text in texts])
    assert [handler.context.get_response_status(index)[0] for index in range(4)] == [413, 200, 503, 200]
    assert "handler.max_held_bytes" in answers[0]["error"] and "send it again" in answers[2]["error"]
    assert [len(answers[index]["colbert_vecs"]) for index in (1, 3)] == [tokens[1] - 1, tokens[3] - 1]
    # only the part an answer reads is held: the first token's row for the dense vector alone,
    # states and weights without ColBERT vectors for the lexical weights
    lexical_fits = tokens[0] * (task.size + 1) <= 100 * task.token_values
    dense, lexical = ask(handler, [{"inputs": texts[0]}, {"inputs": texts[0], "return_sparse": True}])
    assert [handler.context.get_response_status(index)[0] for index in range(2)] == [200, 413 - 213 * lexical_fits]
    monkeypatch.undo()  # the default limit: whole rows of the long text
    (whole,) = ask(handler, [{"inputs": texts[0], **EVERY_OUTPUT}])
    assert dense["dense_vecs"] == whole["dense_vecs"]
    if lexical_fits:
        assert lexical["lexical_weights"] == whole["lexical_weights"]


def test_an_aot_package_serves_the_same_outputs_without_dynamo(m3_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(m3_dir, model)
    build_aot_package("m3-embedding", model, {"handler": {"dtype": "float32", "buckets": GRID}})
    handler = ready_handler("m3-embedding", model, buckets=GRID)
    assert handler.model_source == "aot package" and compiled_graph_count() == 0
    (answers,) = ask(handler, [{"inputs": REFERENCE["texts"], **EVERY_OUTPUT}])
    assert_equal_outputs(answers)
