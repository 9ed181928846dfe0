"""KServe v2 requests in, v2 answers out: parsing, errors, and answers of every task's shape."""

import json

import pytest

from ts_compiled_handlers.protocols import kserve_v2
from ts_compiled_handlers.request.answers import M3, EntityGroup, Generated, Label, Vector
from ts_compiled_handlers.request.payload import RequestError, boolean_param, int_param

PARAMS = {"normalize": boolean_param, "top_k": int_param(1, 5)}


def request(data, shape=None, **extra):
    tensor = {"name": "text", "shape": shape or [len(data)], "datatype": "BYTES", "data": data}
    return {"inputs": [tensor], **extra}


def test_a_v2_request_is_told_apart_from_a_json_one():
    assert kserve_v2.is_v2(request(["a"]))
    assert not kserve_v2.is_v2({"inputs": ["a", "b"]}) and not kserve_v2.is_v2({"inputs": "a"})
    assert not kserve_v2.is_v2({"inputs": []}) and not kserve_v2.is_v2("text")


def test_texts_parameters_and_id_are_read():
    texts, params, request_id = kserve_v2.parse(
        request(["a", "b"], id="42", parameters={"normalize": False}), PARAMS, 4
    )
    assert (texts, params, request_id) == (["a", "b"], {"normalize": False}, "42")
    assert kserve_v2.parse(request(["a", "b"], shape=[1, 2]), PARAMS, 4)[2] == ""


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({**request(["a"]), "extra": 1}, "unknown keys"),
        ({"inputs": [request(["a"])["inputs"][0]] * 2}, "exactly one input"),
        ({"inputs": [{**request(["a"])["inputs"][0], "datatype": "FP32"}]}, "BYTES"),
        (request(["a", "b"], shape=[3]), "does not match"),
        (request(["a"], shape=["1"]), "list of at most 8 sizes"),
        (request(["a"], shape=[1] * 9), "list of at most 8 sizes"),
        (request(["a"], shape=[10**100, 0]), "at most 4 texts"),  # refused before multiplying
        (request(["a", 3]), "'inputs'[1] is not a string"),
        (request(["a"] * 5), "at most 4"),
        (request(["a"], parameters={"stream": True}), "streaming"),
        (request(["a"], parameters={"secret-name": 1}), "unknown parameter"),
        (request(["a"], parameters={"top_k": -1}), "'top_k' must be an integer"),
        (request(["a"], id=7), "'id' must be a string"),
    ],
)
def test_bad_v2_requests_get_a_4xx_that_says_why(body, fragment):
    with pytest.raises(RequestError) as error:
        kserve_v2.parse(body, PARAMS, 4)
    assert error.value.status in (400, 413) and fragment in error.value.message
    assert "secret-name" not in error.value.message


def test_embeddings_become_one_fp32_matrix():
    answer = kserve_v2.response([Vector([0.5, 1.0]), Vector([2.0, 3])], "m", "1.0", "7")
    assert answer == {
        "model_name": "m",
        "model_version": "1.0",
        "id": "7",
        "outputs": [{"name": "embedding", "shape": [2, 2], "datatype": "FP32", "data": [0.5, 1.0, 2.0, 3]}],
    }


def test_embeddings_as_numpy_rows_become_the_same_matrix_of_their_shortest_floats():
    import torch

    rows = list(torch.tensor([[0.1, 0.5], [2.0, 3.0]]).numpy())  # what the embedding task answers: float32 rows
    (output,) = kserve_v2.outputs([Vector(row) for row in rows])
    assert output == {"name": "embedding", "shape": [2, 2], "datatype": "FP32", "data": [0.1, 0.5, 2.0, 3.0]}


def test_labels_and_scores_become_two_tensors_top_k_adds_a_dimension():
    top1 = kserve_v2.outputs([Label("POS", 0.9), Label("NEG", 0.6)])
    assert top1 == [
        {"name": "label", "shape": [2], "datatype": "BYTES", "data": ["POS", "NEG"]},
        {"name": "score", "shape": [2], "datatype": "FP32", "data": [0.9, 0.6]},
    ]
    top2 = kserve_v2.outputs([[Label("A", 0.7), Label("B", 0.3)]] * 3)
    described = [(t["name"], t["shape"], t["datatype"]) for t in top2]
    assert described == [("label", [3, 2], "BYTES"), ("score", [3, 2], "FP32")]


def test_generation_fields_keep_their_types():
    answers = [Generated("hi", "length", 3)] * 2
    types = [(t["name"], t["datatype"], t["shape"]) for t in kserve_v2.outputs(answers)]
    assert types == [
        ("generated_text", "BYTES", [2]),
        ("finish_reason", "BYTES", [2]),
        ("generated_tokens", "INT64", [2]),
    ]


def test_answers_of_no_fixed_shape_become_json_strings():
    entities = [[EntityGroup("PER", 0.9, "alice", 0, 5)], []]
    (tensor,) = kserve_v2.outputs(entities)
    assert tensor["name"] == "output" and tensor["shape"] == [2] and tensor["datatype"] == "BYTES"
    alice = {"entity_group": "PER", "score": 0.9, "word": "alice", "start": 0, "end": 5}
    assert [json.loads(row) for row in tensor["data"]] == [[alice], []]
    # entity lists of one length are still JSON: their kind has no fixed shape
    (tensor,) = kserve_v2.outputs([entities[0]] * 2)
    assert tensor["name"] == "output" and [json.loads(row) for row in tensor["data"]] == [[alice], [alice]]


def test_an_m3_answer_makes_a_tensor_of_each_output_the_request_asked_for():
    answers = [M3(dense_vecs=[0.5, 1.0], lexical_weights={"7": 0.25}), M3(dense_vecs=[1.0, 0.0], lexical_weights={})]
    dense, weights = kserve_v2.outputs(answers)
    assert dense == {"name": "dense_vecs", "shape": [2, 2], "datatype": "FP32", "data": [0.5, 1.0, 1.0, 0.0]}
    assert weights["name"] == "lexical_weights" and [json.loads(row) for row in weights["data"]] == [{"7": 0.25}, {}]
