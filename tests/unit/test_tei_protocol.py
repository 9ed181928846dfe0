"""TEI's bodies read in process: the `parameters` object, TEI's input forms and its error shape
(tests/integration/test_tei_server.py speaks them through TorchServe with TEI's clients)."""

import pytest

from ts_compiled_handlers.protocols import Answered, RequestSpec
from ts_compiled_handlers.protocols.tei import (
    TeiDecodeProtocol,
    TeiEmbedProtocol,
    TeiInfoProtocol,
    TeiPredictProtocol,
    TeiRerankProtocol,
    body_object,
)
from ts_compiled_handlers.request.answers import Label, QueryVectors, Score
from ts_compiled_handlers.request.payload import RequestError, boolean_param, choice_param
from ts_compiled_handlers.tasks.classification import optional_top_k

PARAMS = {
    "normalize": boolean_param,
    "truncate": boolean_param,
    "truncation_direction": choice_param("right", "left"),
    "top_k": optional_top_k,
    "raw_scores": boolean_param,
}
SPEC = RequestSpec(PARAMS, 8, pairs=True, info={"model_id": "m", "max_input_length": 32}, tokenizer=list(range(100)))


def test_parameters_merge_into_the_body_with_nulls_dropped_and_teis_directions_read():
    body = {"inputs": "a", "parameters": {"normalize": False, "truncate": None, "truncation_direction": "Left"}}
    assert body_object(body, "inputs") == {"inputs": "a", "normalize": False, "truncation_direction": "left"}
    request = TeiEmbedProtocol().read(body, SPEC)
    assert request.texts == ["a"] and request.params == {"normalize": False, "truncation_direction": "left"}
    for broken in ({"input": "a"}, {"inputs": "a", "parameters": [1]}, ["a"], {"inputs": None}):
        with pytest.raises(RequestError) as refused:
            TeiEmbedProtocol().read(broken, SPEC)
        assert refused.value.status == 422


def test_predict_takes_a_text_a_pair_or_a_batch_of_either_as_tei_does():
    predict = TeiPredictProtocol()
    single = predict.read({"inputs": "a"}, SPEC)
    assert single.texts == ["a"] and single.form.single and single.params == {"top_k": None}
    pair = predict.read({"inputs": ["q", "p"]}, SPEC)  # a list of two strings is one pair
    assert pair.texts == [("q", "p")] and pair.form.single
    pairs = predict.read({"inputs": [["q", "p"], ["q", "r"]], "raw_scores": True}, SPEC)
    assert pairs.texts == [("q", "p"), ("q", "r")] and not pairs.form.single and pairs.params["raw_scores"]
    texts = predict.read({"inputs": ["a", "b", "c"]}, SPEC)
    assert texts.texts == ["a", "b", "c"] and not texts.form.single
    with pytest.raises(RequestError):
        predict.read({"inputs": [["q", "p"], "c"]}, SPEC)
    answers = [[Label("x", 0.5)]]
    assert predict.encode(single, answers, None) == [{"label": "x", "score": 0.5}]  # one list of labels, as TEI


def test_rerank_takes_teis_texts_and_answers_best_first_with_the_text_asked_for():
    rerank = TeiRerankProtocol()
    assert rerank.accepts({"query": "q", "texts": []}) and not rerank.accepts({"query": "q", "documents": []})
    request = rerank.read({"query": "q", "texts": ["a", "b"], "return_text": True}, SPEC)
    assert request.texts == [("q", "a"), ("q", "b")] and request.scoring == "rerank"
    ranked = rerank.encode(request, [Score(0.1), Score(0.9)], None)
    assert ranked == [{"index": 1, "score": 0.9, "text": "b"}, {"index": 0, "score": 0.1, "text": "a"}]
    no_pairs = RequestSpec(PARAMS, 8, pairs=False)
    with pytest.raises(RequestError, match="does not rerank"):
        rerank.read({"query": "q", "texts": ["a"]}, no_pairs)


def test_rerank_on_a_maxsim_archive_sends_the_query_first_and_takes_raw_scores_as_it_changes_nothing():
    rerank, no_pairs = TeiRerankProtocol("maxsim"), RequestSpec(PARAMS, 8, pairs=False)
    request = rerank.read({"query": "q", "texts": ["a", "b"], "raw_scores": True, "return_text": True}, no_pairs)
    assert request.texts == ["q", "a", "b"] and request.scoring == "maxsim" and request.params == {}
    ranked = rerank.encode(request, [QueryVectors(3), Score(0.1), Score(0.9)], None)
    assert ranked == [{"index": 1, "score": 0.9, "text": "b"}, {"index": 0, "score": 0.1, "text": "a"}]
    with pytest.raises(RequestError, match="raw_scores"):
        rerank.read({"query": "q", "texts": ["a"], "raw_scores": "yes"}, no_pairs)


def test_errors_have_teis_shape_and_decode_checks_the_ids():
    protocol = TeiEmbedProtocol()
    assert protocol.error(RequestError(413, "too many")) == {"error": "too many", "error_type": "Validation"}
    assert protocol.error(RequestError(503, "busy")) == {"error": "busy", "error_type": "Overloaded"}
    assert protocol.error(RequestError(500, "bug")) == {"error": "bug", "error_type": "Backend"}
    for ids in ([], [1, -1], [1, 100], [True], "12", [[1], []]):
        with pytest.raises(RequestError) as refused:
            TeiDecodeProtocol().read({"ids": ids}, SPEC)
        assert refused.value.status == 422, ids
    with pytest.raises(Answered) as info:
        TeiInfoProtocol().read(None, SPEC)
    assert info.value.body == {"model_id": "m", "max_input_length": 32}
