"""Quantized answers: every precision equal to sentence-transformers' `quantize_embeddings`, the
archive's int8/uint8 ranges fixed at build from the calibration texts, and Cohere's v2 embed body."""

import base64
import shutil

import numpy as np
import pytest
from fakes import ready_handler
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import quantize_embeddings
from test_adapters import ask

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.protocols.cohere import prompt
from ts_compiled_handlers.quantizing.calibration import DEFAULT_TEXTS
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.scripts.answer_ranges import write_ranges
from ts_compiled_handlers.tasks.precisions import PRECISIONS, AnswerRanges, quantized, read_ranges

# Eager: the answers are made after the model, alike compiled (the task server serves them compiled)
GRID = {
    "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]},
    "compile": {"enable": False},
    "embedding": {"dimensions": "any"},  # `dimensions` is taken, then refused with int8
}
TEXTS = ["alice walks to paris", "the cat sat on the mat", "zzz"]


@pytest.fixture(scope="module")
def archive_dir(tiny_models, tmp_path_factory):
    """The tiny embedder as `hfserve build` stages it: its answer ranges written beside it."""
    folder = tmp_path_factory.mktemp("embedder") / "model"
    shutil.copytree(tiny_models["embedding"], folder)
    write_ranges(folder, parse({"handler": {"task": "embedding"}}))
    return folder


@pytest.fixture(scope="module")
def handler(archive_dir):
    return ready_handler("embedding", archive_dir, **GRID)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_precision_equals_quantize_embeddings(precision):
    generator = np.random.default_rng(0)
    embeddings = generator.standard_normal((6, 20)).astype(np.float32)
    embeddings[0] = 0  # a zero vector, and below a dimension whose range is one value
    low, high = embeddings.min(axis=0) - 0.1, embeddings.max(axis=0) - 0.2
    low[3] = high[3] = 0.5
    ranges = AnswerRanges(low, high, normalized=False, texts=6)
    made = quantized(embeddings, precision, ranges)
    wanted = quantize_embeddings(embeddings, precision, ranges=ranges.as_array())
    assert made.dtype == wanted.dtype and np.array_equal(made, wanted)


def test_the_archive_ranges_are_the_calibration_texts_embedded_as_sentence_transformers_does(archive_dir):
    ranges = read_ranges(archive_dir)
    model = SentenceTransformer(str(archive_dir), device="cpu")
    normalized = any(type(module).__name__ == "Normalize" for module in model)
    reference = model.encode(list(DEFAULT_TEXTS), normalize_embeddings=normalized)
    assert ranges.texts == len(DEFAULT_TEXTS) and ranges.normalized == normalized
    assert np.allclose(ranges.low, reference.min(axis=0), atol=1e-5)
    assert np.allclose(ranges.high, reference.max(axis=0), atol=1e-5)


def test_an_archive_keeping_token_states_gets_the_same_ranges(archive_dir, tiny_models, tmp_path):
    """`embedding.embed_all` pools after its graph; its ranges are those of the pooled embeddings."""
    folder = tmp_path / "states"
    shutil.copytree(tiny_models["embedding"], folder)
    ranges = write_ranges(folder, parse({"handler": {"task": "embedding", "embedding": {"embed_all": True}}}))
    pooled_in_graph = read_ranges(archive_dir)
    assert np.allclose(ranges.low, pooled_in_graph.low, atol=1e-6)
    assert np.allclose(ranges.high, pooled_in_graph.high, atol=1e-6)


def test_a_precision_on_our_body_equals_quantize_embeddings_with_the_archive_ranges(handler, archive_dir):
    ranges = read_ranges(archive_dir).as_array()
    (floats,) = ask(handler, [{"inputs": TEXTS}])
    floats = np.array([answer["embedding"] for answer in floats], dtype=np.float32)
    bodies = [{"inputs": TEXTS, "precision": precision} for precision in PRECISIONS[1:]]
    for precision, answers in zip(PRECISIONS[1:], ask(handler, bodies), strict=True):
        wanted = quantize_embeddings(floats, precision, ranges=ranges)
        assert np.array_equal(np.array([answer["embedding"] for answer in answers]), wanted), precision


def test_kserve_v2_names_the_answers_type(handler):
    inputs = [{"name": "text", "shape": [2], "datatype": "BYTES", "data": TEXTS[:2]}]
    bodies = [
        {"inputs": inputs, "parameters": {"precision": precision}} for precision in ("float32", "int8", "ubinary")
    ]
    tensors = [answer["outputs"][0] for answer in ask(handler, bodies)]
    assert [(item["datatype"], item["shape"]) for item in tensors] == [
        ("FP32", [2, 32]),
        ("INT8", [2, 32]),
        ("UINT8", [2, 4]),
    ]


def test_cohere_v2_embed_answers_every_type_and_base64_decodes_to_the_floats(handler, archive_dir):
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    body = {"model": "test", "texts": TEXTS, "input_type": "search_document", "embedding_types": types}
    (answer,) = ask(handler, [body], ["v2/embed"])
    embeddings = answer["embeddings"]
    assert sorted(embeddings) == sorted(types) and answer["texts"] == TEXTS
    assert answer["response_type"] == "embeddings_by_type" and answer["meta"]["billed_units"]["input_tokens"] > 0
    floats = np.array(embeddings["float"], dtype=np.float32)
    (plain,) = ask(handler, [{"inputs": TEXTS}])
    assert np.array_equal(floats, np.array([item["embedding"] for item in plain], dtype=np.float32))
    decoded = [np.frombuffer(base64.b64decode(text), dtype="<f4") for text in embeddings["base64"]]
    assert np.array_equal(np.stack(decoded), floats)
    ranges = read_ranges(archive_dir).as_array()
    for kind in types[1:5]:
        assert np.array_equal(np.array(embeddings[kind]), quantize_embeddings(floats, kind, ranges=ranges)), kind


@pytest.mark.parametrize(
    "body, field",
    [
        ({"texts": TEXTS, "input_type": "poetry"}, "input_type"),
        ({"texts": TEXTS, "embedding_types": ["int4"]}, "embedding_types"),
        ({"texts": TEXTS, "embedding_types": "float"}, "embedding_types"),
        ({"texts": TEXTS, "truncate": "MIDDLE"}, "truncate"),
        ({"texts": TEXTS, "truncate": []}, "truncate"),  # unhashable: a 500 once
        ({"texts": TEXTS, "input_type": {}}, "input_type"),
        ({"texts": TEXTS, "max_tokens": 4}, "max_tokens"),
        ({"images": ["data:image/png;base64,AAAA"]}, "images"),
        ({"texts": "one text"}, "texts"),
        ({"texts": TEXTS, "model": "another-model"}, "model"),
        ({"texts": TEXTS, "output_dimension": "all"}, "output_dimension"),
        ({"texts": ["fine", 5]}, "texts"),
    ],
)
def test_a_bad_cohere_body_gets_a_400_naming_its_field_and_its_batch_mates_are_answered(handler, body, field):
    answers = ask(handler, [{"texts": TEXTS}, body], ["v2/embed", "v2/embed"])
    assert len(answers[0]["embeddings"]["float"]) == len(TEXTS)
    assert handler.context.get_response_status(1)[0] in (400, 404)
    assert f"'{field}'" in answers[1]["message"]


def test_int8_is_refused_where_the_ranges_do_not_fit_the_answer(handler, archive_dir, tiny_models):
    bodies = [
        {"inputs": TEXTS, "precision": "int8", "dimensions": 8},
        {"inputs": TEXTS, "precision": "uint8", "normalize": not read_ranges(archive_dir).normalized},
        {"inputs": TEXTS, "precision": "int4"},
        {"inputs": TEXTS, "precision": "binary", "dimensions": 8},
    ]
    answers = ask(handler, bodies)
    assert [handler.context.get_response_status(index)[0] for index in range(3)] == [400, 400, 400]
    assert "dimensions" in answers[0]["error"] and "normalize" in answers[1]["error"]
    assert "precision" in answers[2]["error"] and len(answers[3][0]["embedding"]) == 1  # 8 dimensions: 1 byte
    without_ranges = ready_handler("embedding", tiny_models["embedding"], **GRID)
    (refused,) = ask(without_ranges, [{"inputs": TEXTS, "precision": "int8"}])
    assert without_ranges.context.get_response_status(0)[0] == 400 and "rebuild" in refused["error"]


def test_cohere_input_types_pick_the_models_prompt_of_that_meaning():
    prompts = {"query": "query: ", "passage": "passage: "}
    assert prompt("search_query", prompts) == {"prompt_name": "query"}
    assert prompt("search_document", prompts) == {"prompt_name": "passage"}
    assert prompt("clustering", prompts) == {} and prompt(None, prompts) == {}
    with pytest.raises(RequestError, match="input_type"):
        prompt("image", prompts)
