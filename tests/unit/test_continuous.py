"""Continuous batching in process: a stand-in for TorchServe's frontend drives the decode loop as
its ContinuousBatching aggregator does (tests/integration/test_task_servers.py runs the real one)."""

import json

import pytest
import torch
from fakes import Frontend, make_context, status
from parity import generate_alone
from torch._dynamo.utils import counters
from ts.context import RequestProcessor

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.servers.torchserve.handler import Handler
from ts_compiled_handlers.tasks.generation import refuse_sliding_window

CONFIG = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 2]}, "generation": {"max_new_tokens": 48}}


@pytest.fixture(scope="module")
def handler(tiny_models):
    torch._dynamo.reset()
    counters.clear()
    made = Handler()
    yaml_config = {"continuousBatching": True, "handler": {"task": "text-generation", "dtype": "float32", **CONFIG}}
    made.initialize(make_context(tiny_models["text-generation"], yaml_config))
    made.graphs = compiled_graph_count()
    return made


def test_a_short_request_joins_a_running_long_one_and_leaves_first_with_the_same_tokens(handler, tiny_models):
    front = Frontend(handler)
    long_body = {"inputs": "alice walks to paris and bob runs", "max_new_tokens": 48}
    short_body = {"inputs": "the cat sat", "max_new_tokens": 4}
    front.submit("long", long_body)
    front.call()
    front.call()
    front.submit("short", short_body)
    front.run()
    assert front.finished_at["short"] < front.finished_at["long"]
    assert front.statuses == {"long": 200, "short": 200}
    for name, body in (("long", long_body), ("short", short_body)):
        answer = json.loads(front.body(name))
        assert answer["generated_text"] == generate_alone(
            tiny_models["text-generation"], body["inputs"], body["max_new_tokens"]
        )
    assert compiled_graph_count() == handler.graphs == 1 and handler.engine.model.recompiles_after_ready == 0


def test_more_prompts_than_slots_wait_and_take_the_freed_slots(handler):
    front = Frontend(handler)
    for name in ("a", "b", "c"):
        front.submit(name, {"inputs": f"hello {name}", "max_new_tokens": 3})
    front.submit("list", {"inputs": ["the dog", "a red mat"], "max_new_tokens": 2})
    front.run()
    for name in ("a", "b", "c"):
        assert json.loads(front.body(name))["generated_tokens"] == 3
    assert [item["generated_tokens"] for item in json.loads(front.body("list"))] == [2, 2]
    assert handler.loop.free_slots == 2 and not handler.loop.running


def test_a_client_that_leaves_frees_its_slot_for_the_next_request(handler):
    front = Frontend(handler)
    front.submit("leaver", {"inputs": "the cat", "max_new_tokens": 48})
    front.call()
    assert handler.loop.free_slots == 1
    front.cancel("leaver")
    front.submit("next", {"inputs": "the dog", "max_new_tokens": 2})
    front.run()
    assert json.loads(front.body("next"))["generated_tokens"] == 2
    assert handler.loop.free_slots == 2 and not handler.loop.running


def test_a_bad_request_gets_one_plain_400_while_the_others_run(handler):
    front = Frontend(handler)
    front.submit("good", {"inputs": "the cat", "max_new_tokens": 6})
    front.submit("bad", {"inputs": "the cat", "max_new_tokens": 0})
    front.call()
    assert front.statuses["bad"] == 400 and "max_new_tokens" in json.loads(front.body("bad"))["error"]
    front.run()  # should TorchServe send it again (its connection not yet closed), an empty answer ends it
    assert front.received["bad"][1:] == [""] and front.finished_at["bad"] == 2
    assert json.loads(front.body("good"))["generated_tokens"] == 6 and not handler.loop.running


class FailingPrefill:
    """The loop's engine, whose prefill fails for prompts over 20 tokens."""

    def __init__(self, engine):
        self.engine = engine

    def prefill(self, ids, slot):
        if len(ids) > 20:
            raise RuntimeError("out of memory")
        return self.engine.prefill(ids, slot)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_failing_prefill_ends_its_own_request_only(handler, monkeypatch):
    monkeypatch.setattr(handler.loop, "engine", FailingPrefill(handler.loop.engine))
    front = Frontend(handler)
    front.submit("good", {"inputs": "the cat", "max_new_tokens": 6})
    front.submit("long", {"inputs": "the cat sat on the mat " * 5, "max_new_tokens": 6})
    front.run()
    assert front.statuses == {"good": 200, "long": 500} and "internal error" in json.loads(front.body("long"))["error"]
    assert json.loads(front.body("good"))["generated_tokens"] == 6
    assert handler.loop.free_slots == 2 and not handler.loop.running


def test_a_request_done_in_its_first_call_is_closed_by_an_empty_answer_on_the_next(handler):
    front = Frontend(handler)
    front.submit("quick", {"inputs": "the cat", "max_new_tokens": 1})
    front.call()
    assert json.loads(front.body("quick"))["generated_tokens"] == 1 and "quick" in front.queue
    front.call()
    assert front.received["quick"][-1] == "" and front.finished_at["quick"] == 2 and not handler.loop.running


def test_streamed_chunks_add_up_to_the_final_text(handler):
    front = Frontend(handler)
    front.submit("stream", {"inputs": "hello world", "max_new_tokens": 30, "stream": True})
    front.run()
    lines = [json.loads(line) for line in front.body("stream").splitlines()]
    final = lines[-1]
    assert final["generated_tokens"] == 30
    assert "".join(line["text"] for line in lines[:-1]) == final["generated_text"]
    assert len(front.received["stream"]) > 2  # text arrived over several calls


def test_a_request_past_its_time_limit_ends_with_finish_reason_time(handler):
    front = Frontend(handler)
    handler.loop.max_seconds = 0
    try:
        front.submit("slow", {"inputs": "the cat", "max_new_tokens": 48})
        front.run()
    finally:
        handler.loop.max_seconds = handler.config.generation.max_request_seconds
    answer = json.loads(front.body("slow"))
    assert answer["finish_reason"] == "time" and answer["generated_tokens"] < 48
    assert handler.loop.free_slots == 2


def test_a_running_request_unknown_to_a_restarted_worker_is_closed_with_an_error(handler):
    front = Frontend(handler)
    front.queue["orphan"], front.received["orphan"] = None, []  # resent without a body, never seen here
    front.run()
    assert "restarted" in json.loads(front.body("orphan"))["error"] and front.finished_at["orphan"] == 1


def test_a_new_request_without_a_body_gets_a_plain_400_not_a_stream_close(handler):
    """TorchServe hands an empty body over as no parameters, but with the request's headers: it is
    new (a 400), not a resent request, whose first answer would say false and send no status line."""
    context = handler.context
    context.request_processor = [RequestProcessor({"body": {"content-type": "application/json"}})]
    context.request_ids = {0: "empty"}
    answers = handler.handle([{}], context)
    assert status(context, 0) == 400 and "empty request body" in json.loads(answers[0])["error"]
    assert context.stopping_criteria[0](answers[0]) is None
    context.request_processor = [RequestProcessor({})]  # resent once more, should the connection stay open
    assert handler.handle([{}], context) == [""] and context.stopping_criteria[0]("") is True
    assert not handler.loop.running


def test_sliding_window_models_are_refused_with_continuous_batching():
    from transformers import LlamaConfig, MistralConfig

    with pytest.raises(ValueError, match="sliding-window"):
        refuse_sliding_window(MistralConfig(sliding_window=8), continuous=True)
    refuse_sliding_window(LlamaConfig(), continuous=True)  # full attention: served
    refuse_sliding_window(MistralConfig(sliding_window=8), continuous=False)  # request batches: served


def test_an_answer_that_fails_to_be_made_ends_its_own_request_only(handler, monkeypatch):
    """A defect in one request's final answer (not the model call): a 500 for it, and the loop goes on."""
    final = handler.loop._final_text

    def broken(jobs):
        if jobs[0].accepted.request.texts == ["the dog"]:
            raise ValueError("a defect in making this answer")
        return final(jobs)

    monkeypatch.setattr(handler.loop, "_final_text", broken)
    front = Frontend(handler)
    front.submit("good", {"inputs": "the cat", "max_new_tokens": 3})
    front.submit("broken", {"inputs": "the dog", "max_new_tokens": 3})
    front.run()
    assert front.statuses == {"good": 200, "broken": 500}
    assert "internal error" in json.loads(front.body("broken"))["error"]
    assert json.loads(front.body("good"))["generated_tokens"] == 3
    assert handler.loop.free_slots == 2 and not handler.loop.running


def test_a_defect_in_the_loop_s_call_answers_every_request_of_it_with_a_500(handler, monkeypatch):
    def broken(requests):
        raise RuntimeError("a defect past the loop's own boundaries")

    monkeypatch.setattr(handler.loop, "call", broken)
    front = Frontend(handler)
    front.submit("a", {"inputs": "the cat", "max_new_tokens": 3})
    front.submit("b", {"inputs": "the dog", "max_new_tokens": 3})
    front.call()  # answered plainly, as refusals are
    assert front.statuses == {"a": 500, "b": 500} and "internal error" in json.loads(front.body("a"))["error"]
