"""Every answer bounded before it is made (handlers/request/answer_budget.py): a request whose answer
would pass `handler.max_response_bytes` gets its own 413 naming what to send instead, and its
batch-mates their answers. Past TorchServe's `max_response_size` a reply is never sent: the frontend
drops the worker's channel, and the worker exits with its whole batch. In process, eager models;
tests/integration/test_fuzz_server.py sends the huge tokenize bodies through TorchServe."""

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fakes import decoded, ready_handler, status
from parity import assert_same_answers
from transformers import AutoTokenizer
from ts.context import RequestProcessor

from ts_compiled_handlers.configuration.config import ConfigError, parse
from ts_compiled_handlers.loops.model_thread import ModelThread
from ts_compiled_handlers.loops.scheduled_requests import ScheduledRequests
from ts_compiled_handlers.protocols.openai import EmbeddingsProtocol
from ts_compiled_handlers.protocols.tei import TOKEN_BYTES
from ts_compiled_handlers.request.answer_budget import DEFAULT_LIMIT, AnswerBudget
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.tasks.embedding import FLOAT_BYTES, EmbeddingTask
from ts_compiled_handlers.tasks.precisions import INTEGER_BYTES, AnswerRanges
from ts_compiled_handlers.worker.messages import Incoming

EAGER = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}, "compile": {"enable": False}}
SMALL = 20_000  # the small handler's budget, in bytes
HUGE = "a " * 325_000  # 650 KB of text: 325,000 tokens, ~25 MB of tokenize answer


@pytest.fixture(scope="module")
def handler(tiny_models):
    return ready_handler("embedding", tiny_models["embedding"], **EAGER)


@pytest.fixture(scope="module")
def small(tiny_models):
    return ready_handler("embedding", tiny_models["embedding"], **EAGER, max_response_bytes=SMALL)


def ask(handler, requests: list[tuple[str, object]]) -> tuple[list, list[int]]:
    """One batch of (route, body) through `handle`, as TorchServe calls it: (answers, statuses)."""
    context = handler.context
    headers = [{"body": {"content-type": "application/json"}, **({"url_path": r} if r else {})} for r, _ in requests]
    context.request_processor = [RequestProcessor(header) for header in headers]
    context.request_ids = {index: f"request-{index}" for index in range(len(requests))}
    answers = decoded(handler.handle([{"body": body} for _, body in requests], context), context)
    return answers, [status(context, index) for index in range(len(requests))]


def alone(handler, route: str, body) -> object:
    (answer,), (code,) = ask(handler, [(route, body)])
    assert code == 200, answer
    return answer


def test_a_huge_tokenize_body_is_its_own_413_and_its_batch_mates_are_answered(handler):
    ordinary = [("", {"inputs": "alice walks to paris"}), ("tokenize", {"inputs": ["hello world", "the cat"]})]
    expected = [alone(handler, route, body) for route, body in ordinary]
    batch = [ordinary[0], ("tokenize", {"inputs": HUGE}), ordinary[1], ("tokenize", {"inputs": [HUGE[:7000]] * 64})]
    answers, statuses = ask(handler, batch)
    assert statuses == [200, 413, 200, 413], statuses
    for refused in (answers[1], answers[3]):
        assert refused["error_type"] == "Validation" and "'inputs'" in refused["error"], refused
    assert_same_answers(answers[0], expected[0], tolerance=1e-5)
    assert answers[2] == expected[1]
    again, codes = ask(handler, ordinary)  # the worker still answers, the same
    assert codes == [200, 200] and again[1] == expected[1]
    assert_same_answers(again[0], expected[0], tolerance=1e-5)


def test_a_text_past_teis_character_limit_is_refused_before_it_is_tokenized(handler):
    limit = 250 * handler.worker.reader.spec.info["max_input_length"]  # TEI's: 250 characters per token of the limit
    (answer,), (code,) = ask(handler, [("tokenize", {"inputs": ["hello", "a" * (limit + 1)]})])
    assert code == 413 and f"'inputs'[1] has {limit + 1} characters" in answer["error"]
    tokens = alone(handler, "tokenize", {"inputs": "a" * limit})  # at the limit: answered, every token
    assert len(tokens[0]) == len(AutoTokenizer.from_pretrained(handler.worker.serving.model_dir)("a" * limit).input_ids)


def test_tokens_past_the_budget_are_refused_before_their_answer_is_made(small, monkeypatch):
    from ts_compiled_handlers.protocols import tei

    made = []
    monkeypatch.setattr(tei, "tokens", lambda *args: made.append(args))
    words = SMALL // TOKEN_BYTES  # this many tokens take more than the budget in any answer
    (answer,), (code,) = ask(small, [("tokenize", {"inputs": ["hello " * (words // 2)] * 2})])
    assert code == 413 and made == []
    assert "tokens" in answer["error"] and "handler.max_response_bytes" in answer["error"]


def test_an_answer_past_the_budget_once_encoded_is_refused_by_the_last_guard(handler, small):
    """A tokenize answer the estimate lets through (53 bytes a token, the fewest) but whose JSON is
    larger, and 64 embeddings: each refused on its encoded size, naming each protocol's texts field."""
    text = "london berlin alice river " * 90  # 362 tokens: under SMALL at 53 bytes each, over it as JSON
    tokens = alone(handler, "tokenize", {"inputs": text})[0]
    assert len(tokens) * TOKEN_BYTES <= SMALL < len(json.dumps(tokens, separators=(",", ":")))
    embeddings = {"input": ["the cat sat on the mat"] * 64}
    assert len(json.dumps(alone(handler, "v1/embeddings", embeddings))) > SMALL
    batch = [("tokenize", {"inputs": text}), ("v1/embeddings", embeddings), ("", {"inputs": "hello"})]
    answers, statuses = ask(small, batch)
    assert statuses == [413, 413, 200]
    assert "'inputs'" in answers[0]["error"] and "bytes" in answers[0]["error"]
    assert answers[1]["error"]["param"] == "input" and "'input'" in answers[1]["error"]["message"]
    assert_same_answers(answers[2], alone(handler, "", {"inputs": "hello"}), tolerance=1e-5)


def test_requests_one_at_a_time_are_held_to_the_budget_alike(small):
    """asyncCommunication's loop (handlers/loops/scheduled_requests.py): the same refusals."""
    loop = ScheduledRequests(small.worker, ModelThread())

    async def serve_all(requests):
        return await asyncio.gather(
            *(loop.reply(Incoming(json.dumps(b).encode(), "application/json", r)) for r, b in requests)
        )

    try:
        requests = [
            ("tokenize", {"inputs": HUGE}),
            ("v1/embeddings", {"input": ["the cat"] * 64}),
            ("", {"inputs": "a"}),
        ]
        replies = asyncio.run(serve_all(requests))
    finally:
        loop.model_thread.executor.shutdown()
    assert [reply.status for reply in replies] == [413, 413, 200]
    assert json.loads(replies[1].body)["error"]["param"] == "input"


def test_embeddings_past_the_budget_are_refused_before_their_answer_is_made():
    """texts x dimensions, at the fewest bytes a value takes (base64's), against the budget."""
    task = EmbeddingTask(parse({"handler": {"max_response_bytes": 1000}}))
    task.normalize_default = False
    rows = list(torch.ones(8, 32))
    request = SimpleNamespace(params={}, protocol=EmbeddingsProtocol())
    assert 8 * 32 * FLOAT_BYTES > 1000
    with pytest.raises(RequestError) as refused:
        task.answer(SimpleNamespace(request=request), rows)
    assert refused.value.status == 413 and refused.value.field == "input"
    assert "8 embeddings (32 values each)" in refused.value.message
    shorter = SimpleNamespace(params={"dimensions": 16}, protocol=EmbeddingsProtocol())
    assert 8 * 16 * FLOAT_BYTES <= 1000
    assert len(task.answer(SimpleNamespace(request=shorter), rows)) == 8
    # bytes take fewer: 8 texts of 32 int8 values fit where their floats did not
    task.ranges = AnswerRanges(np.full(32, -1.0, np.float32), np.ones(32, np.float32), normalized=False, texts=8)
    int8 = SimpleNamespace(params={"precision": "int8"}, protocol=EmbeddingsProtocol())
    assert 8 * 32 * INTEGER_BYTES <= 1000 and len(task.answer(SimpleNamespace(request=int8), rows)) == 8


def test_the_budget_counts_bytes_and_names_the_field_and_its_remedy():
    budget = AnswerBudget(10)
    budget.check(2, 5, "values", "inputs", "send fewer texts")  # 10 bytes: within
    with pytest.raises(RequestError) as refused:
        budget.check(3, 5, "values", "top_k", "send top_k")
    assert refused.value.status == 413 and refused.value.field == "top_k"
    assert "3 values" in refused.value.message and "send top_k" in refused.value.message
    assert budget.check_text('"0123456"', "inputs") == '"0123456"'  # 9 bytes
    with pytest.raises(RequestError, match="12 bytes.*'inputs'"):
        budget.check_text('"' + "\u00e9" * 5 + '"', "inputs")  # 7 characters, 12 bytes


def test_the_budget_is_a_handler_option_under_torchserves_response_limit():
    assert parse({}).max_response_bytes == DEFAULT_LIMIT < 6_553_500  # TorchServe's own max_response_size
    assert parse({"handler": {"max_response_bytes": 1024}}).max_response_bytes == 1024
    for bad in (0, -1, "8MiB", True):
        with pytest.raises(ConfigError, match="max_response_bytes"):
            parse({"handler": {"max_response_bytes": bad}})
