"""The token scheduler (handlers/loops/token_scheduler.py) alone, then the async `handle` over a real tiny model."""

import asyncio
import json
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import ts
from fakes import (
    AsyncWorker,
    answered,
    as_client_sees,
    frontend_message,
    make_context,
    ready_handler,
    served_over_socket,
)
from transformers import AutoTokenizer
from ts.metrics.metric_cache_errors import MetricsCacheKeyError
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

from ts_compiled_handlers.configuration.config import ConfigError
from ts_compiled_handlers.engine.buckets import BucketPlan
from ts_compiled_handlers.loops import scheduled_requests
from ts_compiled_handlers.loops.token_scheduler import TokenScheduler
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.servers.torchserve import async_worker, settings
from ts_compiled_handlers.servers.torchserve.handler import Handler
from ts_compiled_handlers.worker.worker import Worker


class GatedCall:
    """A model call that records its items and, while `gate` is clear, holds the first call open."""

    def __init__(self, fail_on=None):
        self.calls: list[list] = []
        self.gate = threading.Event()
        self.fail_on = fail_on

    def __call__(self, items: list) -> list:
        self.calls.append(list(items))
        if len(self.calls) == 1:
            self.gate.wait(10)
        if self.fail_on in items:
            raise ValueError("poisoned")
        return [f"out-{item}" for item in items]


async def submit_all(scheduler: TokenScheduler, items: dict, release: threading.Event | None = None) -> list:
    """Submit (item: tokens) in order, each once the previous one is queued; then open the gate."""
    tasks = []
    for item, tokens in items.items():
        tasks.append(asyncio.create_task(scheduler.submit(item, tokens)))
        await asyncio.sleep(0)
    if release is not None:
        await asyncio.sleep(0.05)  # the first call is running, the rest queued behind it
        release.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_a_lone_request_starts_a_call_at_once_and_later_ones_share_the_next_call_up_to_the_budget():
    call = GatedCall()
    scheduler = TokenScheduler(call, call_tokens=100, max_queue=10)
    items = {"first": 10, "a": 60, "b": 50, "c": 30, "d": 5}
    outputs = asyncio.run(submit_all(scheduler, items, call.gate))
    assert outputs == [f"out-{item}" for item in items]  # every request its own output
    # The first ran alone; then the oldest (a), and the later ones that still fit 100 tokens (c, d);
    # b did not fit and went next.
    assert call.calls == [["first"], ["a", "c", "d"], ["b"]]
    assert scheduler.held == 0 and not scheduler.queue and scheduler.draining is None


def test_a_request_over_the_budget_runs_alone_and_is_never_starved():
    call = GatedCall()
    scheduler = TokenScheduler(call, call_tokens=100, max_queue=10)
    asyncio.run(submit_all(scheduler, {"first": 1, "huge": 500, "small": 1}, call.gate))
    assert call.calls == [["first"], ["huge"], ["small"]]


def test_a_failing_call_is_split_until_only_its_culprit_fails():
    call = GatedCall(fail_on="bad")
    splits = []
    scheduler = TokenScheduler(call, call_tokens=100, max_queue=10, on_split=splits.append)
    outputs = asyncio.run(submit_all(scheduler, {"first": 1, "a": 1, "bad": 1, "c": 1, "d": 1}, call.gate))
    assert outputs[:2] == ["out-first", "out-a"] and outputs[3:] == ["out-c", "out-d"]
    assert isinstance(outputs[2], ValueError)
    assert len(splits) == 2  # [a, bad, c, d] -> [a, bad] -> [bad]


def test_under_load_the_next_call_waits_for_the_last_calls_clients_and_an_idle_engine_never_waits():
    """`fill_seconds`: a lone request starts a call at once; requests that waited through a call
    let the next one wait (here at most 5 s) until as many more as that call took have come."""
    call = GatedCall()
    scheduler = TokenScheduler(call, call_tokens=100, max_queue=10, fill_seconds=5.0)

    async def scenario() -> tuple[float, float, int]:
        began = time.perf_counter()
        first = asyncio.create_task(scheduler.submit("first", 10))
        await asyncio.sleep(0.05)
        queued = [asyncio.create_task(scheduler.submit(item, 10)) for item in ("a", "b")]
        await asyncio.sleep(0.01)
        call.gate.set()
        await first
        lone = time.perf_counter() - began
        await asyncio.sleep(0.1)
        calls_while_filling = len(call.calls)
        await asyncio.gather(*queued, scheduler.submit("c", 10))  # first's client, back: the call goes
        return lone, time.perf_counter() - began, calls_while_filling

    lone, whole, calls_while_filling = asyncio.run(scenario())
    assert call.calls == [["first"], ["a", "b", "c"]] and calls_while_filling == 1
    assert lone < 1.0 and whole < 2.0  # neither the lone call nor the filled one waited out the 5 s
    assert scheduler.queued_tokens == 0 and scheduler.filled is None


def test_a_fill_ends_once_the_queue_holds_the_call_budget():
    call = GatedCall()
    scheduler = TokenScheduler(call, call_tokens=100, max_queue=10, fill_seconds=5.0)

    async def scenario() -> float:
        began = time.perf_counter()
        together = [asyncio.create_task(scheduler.submit(item, 1)) for item in ("x", "y", "z")]  # one call
        await asyncio.sleep(0.05)
        a = asyncio.create_task(scheduler.submit("a", 95))
        await asyncio.sleep(0.01)
        call.gate.set()
        await asyncio.sleep(0.1)  # the next call waits for 3 more requests, or 100 tokens
        await asyncio.gather(*together, a, scheduler.submit("b", 5))
        return time.perf_counter() - began

    assert asyncio.run(scenario()) < 2.0
    assert call.calls == [["x", "y", "z"], ["a", "b"]]


def test_the_queue_is_full_at_max_queue_held_requests_and_frees_as_they_are_answered():
    call = GatedCall()
    scheduler = TokenScheduler(call, call_tokens=100, max_queue=3)
    seen = []

    async def scenario():
        tasks = [asyncio.create_task(scheduler.submit(i, 1)) for i in range(3)]
        await asyncio.sleep(0.05)
        seen.append(scheduler.full)
        call.gate.set()
        await asyncio.gather(*tasks)
        seen.append(scheduler.full)

    asyncio.run(scenario())
    assert seen == [True, False]


def test_calls_report_their_tokens_and_each_requests_wait():
    call = GatedCall()
    reports = []
    scheduler = TokenScheduler(call, call_tokens=100, max_queue=10, on_call=reports.append)
    asyncio.run(submit_all(scheduler, {"first": 7, "a": 3, "b": 4}, call.gate))
    assert [(report.requests, report.tokens) for report in reports] == [(1, 7), (2, 7)]
    assert all(len(report.waited) == report.requests for report in reports)
    assert min(reports[1].waited) >= 0.05  # they waited behind the first call


def test_async_communication_is_read_checked_and_refused_for_generation():
    assert settings.read({"asyncCommunication": True}, "embedding")["one_at_a_time"]
    assert not settings.read({}, "embedding")["one_at_a_time"]
    with pytest.raises(ConfigError, match="true | false"):
        settings.read({"asyncCommunication": "yes"}, "embedding")
    with pytest.raises(ConfigError, match="continuousBatching"):
        settings.read({"asyncCommunication": True}, "text-generation")


def test_an_async_archive_takes_requests_one_at_a_time_as_torchserve_0_12_needs():
    assert build_mar.model_config("embedding", {"asyncCommunication": True})["batchSize"] == 1
    with pytest.raises(ConfigError, match="batchSize=4 .*TorchServe 0.12 fails"):
        build_mar.model_config("embedding", {"asyncCommunication": True, "batchSize": 4})
    request_batches = build_mar.model_config("embedding", {})
    assert request_batches["batchSize"] == 32 and "asyncCommunication" not in request_batches
    assert build_mar.model_config("text-generation", {})["batchSize"] == 8  # its decode loop's slots


def test_traffic_metrics_are_in_the_worker_cache_before_traffic_even_when_its_config_lacks_them(tiny_models):
    """Else the model's thread would add them to the dict that every request's context copy reads."""
    defaults = Path(ts.__file__).parent / "configs" / "metrics.yaml"  # TorchServe's own: none of ours
    metrics = MetricsCacheYamlImpl(str(defaults))
    metrics.initialize_cache()
    context = make_context(tiny_models["embedding"], {"handler": {"compile": {"enable": False}}})
    context.metrics = metrics
    with pytest.raises(MetricsCacheKeyError):
        metrics.get_metric("BucketRequests", MetricTypes.COUNTER)
    Handler().initialize(context)
    assert metrics.get_metric("BucketRequests", MetricTypes.COUNTER).unit == "Count"
    assert metrics.get_metric("PaddedTokenRatio", MetricTypes.GAUGE).unit == "Ratio"


def test_a_registration_batch_size_over_1_is_refused_at_initialize(tiny_models):
    context = make_context(tiny_models["embedding"], {"asyncCommunication": True}, batch_size=8)
    with pytest.raises(ConfigError, match="batchSize=8"):
        Handler().initialize(context)


def test_the_auto_budget_is_the_largest_rows_of_the_pack_budget_within_max_tokens():
    assert BucketPlan((16, 256), (1, 2, 4, 8), "all", 256, 4096).full_call_tokens == 8 * 256
    assert BucketPlan((16, 512), (1, 2, 4, 8), "all", None, 4096).full_call_tokens == 8 * 512
    assert BucketPlan((16, 8192), (1, 2, 4, 8), "all", None, 4096).full_call_tokens == 1 * 8192


# -- the async handle over a real tiny model, driven as ts/async_service.py drives it ------------
TEXTS = ["a", "alice walks to paris with bob " * 3, "bob", "the river runs past the mill " * 4, "c d e"]


class RecordingBuild(Handler):
    """Records the thread that built and warmed the engine."""

    class worker_class(Worker):
        built_in = None

        @classmethod
        def build(cls, *args, **kwargs):
            cls.built_in = threading.current_thread().name
            return super().build(*args, **kwargs)


@pytest.fixture(scope="module")
def handlers(tiny_models):
    grid = {"buckets": {"seq_lens": [8, 32, 64], "batch_sizes": [1, 2, 4]}, "compile": {"enable": False}}
    threads = torch.get_num_threads()
    scheduled = RecordingBuild()
    handler_config = {"dtype": "float32", **grid, "scheduler": {"max_queue": 4}}
    scheduled.initialize(
        make_context(tiny_models["embedding"], {"asyncCommunication": True, "handler": handler_config}, batch_size=1)
    )
    held_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # this test process's thread is not an event loop's: give it back
    batched = ready_handler("embedding", tiny_models["embedding"], **grid)
    yield scheduled, batched, held_threads
    scheduled.loop.model_thread.executor.shutdown()


def test_the_model_is_built_and_called_in_one_thread_and_the_loop_thread_starts_no_team(handlers):
    scheduled, _, held_threads = handlers
    model_thread = scheduled.loop.model_thread
    assert scheduled.loop.scheduler.executor is model_thread.executor
    assert scheduled.worker_class.built_in == model_thread.run(lambda: threading.current_thread().name)
    assert "model-call" in scheduled.worker_class.built_in
    assert model_thread.run(torch.get_num_threads) == scheduled.threads.threads
    if "ATen parallel backend: OpenMP" in torch.__config__.parallel_info():  # the caller was held to 1
        assert held_threads == 1


def served(handler, requests: dict) -> dict:
    return asyncio.run(AsyncWorker(handler).serve(requests))


def test_concurrent_mixed_lengths_are_each_answered_right_in_two_messages(handlers):
    scheduled, batched, _ = handlers
    requests = {f"r{i}": {"inputs": text} for i, text in enumerate(TEXTS[:4])}
    sent = served(scheduled, requests)
    expected = answered(batched, list(requests.values()))
    for (request_id, messages), reference in zip(sent.items(), expected, strict=True):
        status, body = as_client_sees(messages)
        assert status == 200 and messages[0]["content_type"] == "application/json"
        assert messages[0]["headers"]["x-prompt-tokens"].isdigit()
        got = torch.tensor(json.loads(body)["embedding"])
        assert torch.allclose(got, torch.tensor(reference["embedding"]), atol=1e-5), request_id


def test_our_async_worker_loop_serves_the_real_handler_as_torchserves_loop_does(handlers):
    """handlers/servers/torchserve/async_worker.py over a real socket pair, the frontend's frames in
    and out, against the stand-in of TorchServe's own loop: the same statuses, bodies and messages."""
    scheduled, _, _ = handlers
    requests = {"a": {"inputs": TEXTS[0]}, "bad": {"inputs": ""}, "b": {"inputs": TEXTS[1]}}
    reference = served(scheduled, requests)
    service = types.SimpleNamespace(context=scheduled.context, _entry_point=scheduled.handle)
    frames = [frontend_message({request_id: json.dumps(body).encode()}) for request_id, body in requests.items()]
    sent, ended = served_over_socket(async_worker.AsyncWorker, service, frames, answers=2 * len(requests))
    by_request = {}
    for answer in (answer for message in sent for answer in message):
        by_request.setdefault(answer["id"], []).append(answer)
    for request_id in requests:
        (status, body), (expected_status, expected) = (
            as_client_sees(by_request[request_id]),
            as_client_sees(reference[request_id]),
        )
        assert status == expected_status and by_request[request_id][0]["headers"] == reference[request_id][0]["headers"]
        if status == 200:
            got, want = (torch.tensor(json.loads(each)["embedding"]) for each in (body, expected))
            assert torch.allclose(got, want, atol=1e-5), request_id
        else:
            assert json.loads(body) == json.loads(expected)
    assert ended == {"exit": 0}


def test_a_hostile_request_among_them_gets_its_own_plain_4xx(handlers):
    scheduled, _, _ = handlers
    sent = served(
        scheduled, {"good": {"inputs": "hello"}, "bad": {"inputs": ""}, "odd": {"inputs": "x", "normalize": 3}}
    )
    assert as_client_sees(sent["good"])[0] == 200
    for request_id in ("bad", "odd"):
        status, body = as_client_sees(sent[request_id])
        assert status == 400 and "error" in json.loads(body)


def test_past_max_queue_requests_get_503_at_once_and_the_held_ones_are_served(handlers):
    scheduled, _, _ = handlers
    sent = served(scheduled, {f"r{i}": {"inputs": TEXTS[i % len(TEXTS)]} for i in range(9)})
    statuses = [as_client_sees(messages)[0] for messages in sent.values()]
    assert statuses.count(200) >= 4 and set(statuses) == {200, 503}
    refused = [json.loads(as_client_sees(messages)[1]) for messages in sent.values() if messages[0]["code"] == 503]
    assert all("max_queue" in body["error"] for body in refused)
    assert scheduled.loop.scheduler.held == 0


def test_an_answer_that_cannot_be_sent_the_async_way_goes_plain_and_handle_never_raises(handlers, monkeypatch):
    scheduled, _, _ = handlers

    def broken():
        raise LookupError("no out-queue here")

    monkeypatch.setattr(async_worker, "out_queue", broken)
    sent = served(scheduled, {"r": {"inputs": "hello"}})
    (plain,) = sent["r"]  # one message: the answer itself, with its status and no header
    assert plain["code"] == 200 and "ts_stream_next" not in plain["headers"]
    assert len(json.loads(plain["body"])["embedding"]) > 0


def test_per_token_rows_are_held_within_max_held_bytes_and_a_large_answer_leaves_the_event_loop(
    tiny_models, monkeypatch
):
    """An `embed_all` archive's rows (each token's state) are counted from the tokens before the
    request is queued: one that alone passes `max_held_bytes` gets 413 naming it; every answer made
    from more rows than OFF_LOOP_BYTES is made in the answer thread, not on the event loop."""
    folder = Path(tiny_models["embedding"])
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    texts = {"long": "river " * 60, "mid": "river " * 20, "short": "a"}
    tokens = {
        name: len(ids)
        for name, ids in zip(texts, AutoTokenizer.from_pretrained(folder)(list(texts.values())).input_ids, strict=True)
    }
    assert tokens["short"] < tokens["mid"] < min(tokens["long"], 64)  # the long one held at 64 once cut
    handler_config = {
        "dtype": "float32",
        "buckets": {"seq_lens": [8, 32, 64], "batch_sizes": [1, 2, 4]},
        "compile": {"enable": False},
        "embedding": {"embed_all": True},
        "max_held_bytes": (tokens["mid"] + tokens["short"]) * hidden * 4,  # both at once, not the long one
    }
    threads = torch.get_num_threads()
    handler = Handler()
    handler.initialize(
        make_context(tiny_models["embedding"], {"asyncCommunication": True, "handler": handler_config}, batch_size=1)
    )
    torch.set_num_threads(threads)
    answered_in = []
    reply = Worker.reply

    def recorded(*args):
        answered_in.append(threading.current_thread().name)
        return reply(*args)

    monkeypatch.setattr(Worker, "reply", recorded)
    monkeypatch.setattr(scheduled_requests, "OFF_LOOP_BYTES", tokens["mid"] * hidden * 4)
    try:
        sent = served(handler, {name: {"inputs": text} for name, text in texts.items()})
    finally:
        handler.loop.model_thread.executor.shutdown()
    statuses = {request_id: as_client_sees(messages)[0] for request_id, messages in sent.items()}
    assert statuses == {"long": 413, "mid": 200, "short": 200}
    assert "handler.max_held_bytes" in json.loads(as_client_sees(sent["long"])[1])["error"]
    assert sorted(name.split("_")[0] for name in answered_in) == ["MainThread", "answer"]  # short, mid
    assert handler.loop.rows.held == 0
