"""Answers as JSON text (handlers/runtime/json_text.py): the same values either way, and what JSON cannot
carry refused with or without orjson."""

import json
import math

import numpy as np
import pytest

from ts_compiled_handlers.request.answers import M3, Label, Vector
from ts_compiled_handlers.runtime import json_text

ANSWERS = [
    [[0.1234567890123, -1e-12, 3.0, 1e300]],
    {"object": "list", "data": [{"embedding": [0.5, -0.25], "index": 0}], "usage": {"prompt_tokens": 7}},
    {"label": "POSITIVE", "score": 0.99, "none": None, "nested": [[1, 2], {"x": True}]},
    {1: "a key that is an integer", "é": 'ünïcödé \u2028 " \\'},
    [2**70, 1],  # past 64 bits: orjson refuses it, the standard library carries it
    [],
]


@pytest.fixture(params=["orjson", "json"])
def encoder(request, monkeypatch):
    if request.param == "json":
        monkeypatch.setattr(json_text, "orjson", None)
    else:
        assert json_text.orjson is not None, "the package's install brings orjson"
    return json_text.as_json


@pytest.mark.parametrize("answer", ANSWERS)
def test_an_answer_reads_back_as_the_standard_library_writes_it(encoder, answer):
    assert json.loads(encoder(answer)) == json.loads(json.dumps(answer))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_what_json_cannot_carry_is_refused_however_deep(encoder, bad):
    with pytest.raises(ValueError):
        encoder({"data": [{"embedding": [0.1, bad]}]})


def test_a_typed_answer_is_the_object_of_its_fields_that_are_not_none(encoder):
    row = np.array([0.25, -0.5], dtype=np.float32)
    answers = [Vector(row), [Label("POSITIVE", 0.99)], M3(dense_vecs=row, colbert_vecs=np.ones((2, 2), np.float32))]
    assert json.loads(encoder(answers)) == [
        {"embedding": [0.25, -0.5]},
        [{"label": "POSITIVE", "score": 0.99}],
        {"dense_vecs": [0.25, -0.5], "colbert_vecs": [[1.0, 1.0], [1.0, 1.0]]},
    ]
    with pytest.raises(ValueError):
        encoder(Vector(np.array([np.nan], dtype=np.float32)))


def test_text_goes_as_it_is(encoder):
    assert encoder('{"already": "json"}') == '{"already": "json"}'


def rows_of(matrix) -> list:
    """A float32 matrix's rows as the embedding task answers them (handlers/tasks/embedding.py)."""
    return list(np.ascontiguousarray(matrix, dtype=np.float32))


def test_embeddings_print_shortest_and_read_back_as_the_same_float32_values():
    import torch

    matrix = torch.nn.functional.normalize(torch.randn(3, 384, generator=torch.Generator().manual_seed(0)), dim=-1)
    rows = rows_of(matrix.numpy())
    text = json_text.as_json([{"embedding": row} for row in rows])
    read = torch.tensor([answer["embedding"] for answer in json.loads(text)], dtype=torch.float32)
    assert torch.equal(read, matrix)  # every value the same float32
    assert len(text) < 0.65 * len(json.dumps(matrix.tolist()))
    assert json_text.as_json([json_text.plain(row) for row in rows]) == json_text.as_json(rows)  # plain(): same text
    sliced = matrix.numpy()[:, :64]  # `dimensions`: a view that is not contiguous
    assert torch.equal(torch.tensor(json.loads(json_text.as_json(rows_of(sliced)))), matrix[:, :64])
    strided = matrix.numpy()[:, ::2]  # rows that are not C-contiguous: orjson refuses them, `plain` writes them
    assert torch.equal(torch.tensor(json.loads(json_text.as_json(list(strided)))), matrix[:, ::2])


def test_without_orjson_numpy_rows_are_written_by_the_standard_library(monkeypatch):
    rows = rows_of(np.array([[0.5, 0.25], [1.0, 2.0]]))
    monkeypatch.setattr(json_text, "orjson", None)
    assert json.loads(json_text.as_json([{"embedding": row} for row in rows])) == [
        {"embedding": [0.5, 0.25]},
        {"embedding": [1.0, 2.0]},
    ]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_numpy_row_that_json_cannot_carry_is_refused(bad):
    import torch

    (row,) = rows_of(torch.tensor([[0.5, bad]]).numpy())
    with pytest.raises(ValueError):
        json_text.as_json({"data": [{"embedding": row}], "none": None})
    assert math.isnan(json_text.plain(row)[1]) or json_text.plain(row)[1] == bad
    with pytest.raises(TypeError):
        json_text.plain(object())
