"""Per-request isolation in process: hostile bodies among ordinary ones, a model call that raises,
TorchServe's preprocess/inference/postprocess shape. Models run eagerly here (the boundaries do not
depend on compilation); tests/integration/test_fuzz_server.py sends the same cases through TorchServe."""

import dataclasses
import logging

import pytest
from fakes import RecordingMetrics, RecordingSocket, decoded, ready_handler, start_batch, status
from fuzzing import Case, hostile_cases, ordinary, torchserve_request
from parity import assert_same_answers
from transformers import AutoTokenizer

from ts_compiled_handlers.engine.runner import ModelRunner
from ts_compiled_handlers.request.payload import is_unicode_text
from ts_compiled_handlers.servers.torchserve.handler import Handler

GRID = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
EAGER = {"buckets": GRID, "compile": {"enable": False}, "warmup": {"iterations": 1}}
TASKS = {  # a task: its configuration beside EAGER's
    "embedding": {},
    "text-classification": {},
    "token-classification": {},
    "text-generation": {"generation": {"max_new_tokens": 8}},
    "multi-vector": {},
    "m3-embedding": {},
}
MODELS = {"multi-vector": "colbert", "m3-embedding": "m3"}  # a task's tiny model, where its name is not the task's
ORDINARY = ["alice walks to paris quickly", "the cat sat on the red mat in berlin", "hello"]


@pytest.fixture(scope="module")
def handlers(tiny_models):
    return {
        task: ready_handler(task, tiny_models[MODELS.get(task, task)], **EAGER, **extra)
        for task, extra in TASKS.items()
    }


def run(handler, requests: list[dict], content_types: list[str]) -> tuple[list, list[int]]:
    """`handle` over one batch as a TorchServe worker calls it; (answers, statuses)."""
    context = handler.context
    start_batch(context, content_types)
    context.request_ids = {index: f"request-{index}" for index in range(len(requests))}
    context.cl_socket = RecordingSocket()
    answers = decoded(handler.handle(requests, context), context)
    return answers, [status(context, index) for index in range(len(requests))]


@pytest.mark.parametrize("task", TASKS)
def test_hostile_bodies_get_their_own_4xx_and_never_spoil_the_ordinary_requests(handlers, task):
    handler = handlers[task]
    alone = {text: run(handler, [{"body": ordinary(task, text)}], ["application/json"])[0][0] for text in ORDINARY}
    cases = list(hostile_cases(task, seed=7, count=120))
    for start in range(0, len(cases), 5):
        chunk = cases[start : start + 5]
        texts = [ORDINARY[(start + k) % len(ORDINARY)] for k in range(3)]
        requests = [torchserve_request(case) for case in chunk] + [{"body": ordinary(task, t)} for t in texts]
        types = [case.content_type for case in chunk] + ["application/json"] * 3
        answers, statuses = run(handler, requests, types)
        for case, code, answer in zip(chunk, statuses, answers, strict=False):
            assert code == 200 or 400 <= code < 500, f"{code} {answer} for {case}"
            assert code == 200 or set(answer) == {"error", "code"}, case
        for text, code, answer in zip(texts, statuses[5:], answers[len(chunk) :], strict=True):
            assert code == 200
            assert_same(answer, alone[text])


def assert_same(answer, expected) -> None:
    """Same labels, words, texts and structure; numbers within 1e-5 (batching changes the padding)."""
    assert_same_answers(answer, expected, tolerance=1e-5)


# -- the kinds found by hand and by the fuzzer, one regression test each ----------------------
DEEP = b"[" * 5000 + b"]" * 5000
REGRESSIONS = [  # (body, content type, the error's fragment)
    (DEEP, "application/json", "nested deeper"),
    (b'{"inputs": ' + DEEP + b"}", "application/json", "nested deeper"),
    (b'{"inputs": ' + b"[" * 500 + b"]" * 500 + b"}", "application/json", "nested deeper"),
    (b'{"inputs": "\\ud800"}', "application/json", "lone surrogate"),
    (b'{"inputs": ["ok", "a\\udfffb"]}', "application/json", "lone surrogate"),
    (b'{"inputs": "x", "normalize": ' + b"9" * 5000 + b"}", "application/json; charset=utf-8", "cannot be read"),
    (b'{"inputs": "x", "normalize": ' + b"9" * 5000 + b"}", "application/json", "cannot be read"),
]


@pytest.mark.parametrize("body, content_type, fragment", REGRESSIONS)
def test_each_hostile_kind_is_its_requests_400_alone(handlers, body, content_type, fragment):
    handler = handlers["embedding"]
    requests = [{"body": ordinary("embedding", "hello")}, torchserve_request_of(body, content_type)]
    answers, statuses = run(handler, requests, ["application/json", content_type])
    assert statuses == [200, 400]
    assert fragment is None or fragment in answers[1]["error"]


def torchserve_request_of(body: bytes, content_type: str) -> dict:
    return torchserve_request(Case("regression", body, content_type))


def test_a_v2_id_with_a_lone_surrogate_is_refused(handlers):
    body = {"id": "\ud800", "inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
    answers, statuses = run(handlers["embedding"], [{"body": body}], ["application/json"])
    assert statuses == [400] and "'id'" in answers[0]["error"]


def test_a_tiny_temperature_samples_the_most_likely_token_and_spoils_nothing(handlers):
    handler = handlers["text-generation"]
    greedy = {"inputs": ORDINARY[0], "max_new_tokens": 6}
    tiny = {**greedy, "do_sample": True, "temperature": 1e-300, "seed": 3}
    answers, statuses = run(handler, [{"body": greedy}, {"body": tiny}, {"body": greedy}], ["application/json"] * 3)
    assert statuses == [200, 200, 200]
    assert answers[0] == answers[1] == answers[2]


def test_the_check_for_text_agrees_with_what_the_tokenizer_takes(tiny_models):
    """Every character class of the fuzzer, alone and inside text: refused exactly where the tokenizer fails."""
    from fuzzing import ALPHABET

    tokenizers = [AutoTokenizer.from_pretrained(tiny_models[task]) for task in ("embedding", "text-generation")]
    samples = [*ALPHABET, *(f"a{c}b" for c in ALPHABET), *(chr(c) for c in range(0xD7F0, 0xE010))]
    for tokenizer in tokenizers:
        for text in samples:
            try:
                tokenizer([text])
                accepted = True
            except TypeError:
                accepted = False
            assert is_unicode_text(text) == accepted, repr(text)


# -- a batched model call that raises ---------------------------------------------------------
POISON = "zzz"  # "z ##z ##z": "##z" is in no other text of the test


class PoisonedModel(ModelRunner):
    """The handler's model, raising for any batch that holds the poison text's first token."""

    def __init__(self, model: ModelRunner, poison_id: int):
        super().__init__(model.eager)
        self.model, self.poison_id = model, poison_id
        self.ready = model.ready

    def __call__(self, inputs):
        if (inputs["input_ids"] == self.poison_id).any():
            raise RuntimeError(f"secret {POISON} text")
        return self.model(inputs)


def test_a_raising_model_call_is_split_until_only_the_culprit_fails(handlers, caplog):
    handler = handlers["embedding"]
    texts = [f"{word} sees the river" for word in ("alice", "bob", "carol", "dave", "erin")]
    alone = [run(handler, [{"body": {"inputs": text}}], ["application/json"])[0][0] for text in texts]
    poison_id = handler.tokenizer(POISON)["input_ids"][2]
    bodies = [{"inputs": text} for text in texts]
    bodies.insert(3, {"inputs": f"{POISON} sees the river"})
    real = handler.loop.worker
    poisoned = dataclasses.replace(real, engine=real.engine.on(PoisonedModel(real.engine.model, poison_id)))
    handler.loop.worker, handler.context.metrics = poisoned, RecordingMetrics()
    metrics = handler.context.metrics
    try:
        with caplog.at_level(logging.INFO):
            answers, statuses = run(handler, [{"body": body} for body in bodies], ["application/json"] * 6)
    finally:
        handler.loop.worker, handler.context.metrics = real, None
    assert statuses == [200, 200, 200, 500, 200, 200]
    assert answers[3] == {"error": answers[3]["error"], "code": 500} and "server log" in answers[3]["error"]
    for answer, expected in zip(answers[:3] + answers[4:], alone, strict=True):
        assert_same(answer, expected)
    assert "RuntimeError" in caplog.text and POISON not in caplog.text and "river" not in caplog.text
    # 6 requests: [0-5] fails, [0-2] passes, [3-5] fails, [3] fails alone, [4-5] passes
    counted = [(name, dims.get("Cause") or dims.get("Stage"), value) for name, value, dims, _ in metrics.calls]
    assert [call for call in counted if call[0] in ("BatchSplits", "RequestFailures")] == [
        ("BatchSplits", "RuntimeError", 1),
        ("BatchSplits", "RuntimeError", 1),
        ("RequestFailures", "inference", 1),
    ]


# -- TorchServe's handler shape ---------------------------------------------------------------
class Shouting(Handler):
    """A user's subclass, written the way TorchServe's docs teach: steps overridden, super() called."""

    def preprocess(self, data):
        shouted = [{"body": {"inputs": request["body"]["inputs"].upper()}} for request in data]
        return super().preprocess(shouted)

    def postprocess(self, data):
        return [{**answer, "dimensions": len(answer["embedding"])} for answer in super().postprocess(data)]


def test_a_subclass_overrides_preprocess_and_postprocess_the_torchserve_way(handlers, tiny_models):
    plain = handlers["embedding"]
    shouting = ready_handler(Shouting, tiny_models["embedding"], **EAGER)
    answers, statuses = run(shouting, [{"body": {"inputs": "hello world"}}], ["application/json"])
    (expected,), _ = run(plain, [{"body": {"inputs": "HELLO WORLD"}}], ["application/json"])
    assert statuses == [200] and answers[0]["dimensions"] == len(expected["embedding"])
    assert_same({"embedding": answers[0]["embedding"]}, expected)


class BrokenPreprocess(Handler):
    def preprocess(self, data):
        raise ValueError("a defect in a subclass")


def test_a_defect_past_the_boundaries_still_answers_every_request_with_500(tiny_models):
    handler = ready_handler(BrokenPreprocess, tiny_models["embedding"], **EAGER)
    answers, statuses = run(handler, [{"body": {"inputs": "a"}}, {"body": {"inputs": "b"}}], ["application/json"] * 2)
    assert statuses == [500, 500] and all(answer["code"] == 500 for answer in answers)
