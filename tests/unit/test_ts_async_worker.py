"""Our async worker loop (handlers/servers/torchserve/async_worker.py) over a real socket pair: what
the frontend receives for a handler that answers, fails or misanswers, how the loop ends, and that
the adapter puts it in TorchServe's place only in TorchServe's worker, of the release it mirrors.
The real handler's answers through it are checked in test_scheduler.py."""

import asyncio
import json
import sys
import types

import pytest
from fakes import frontend_message, make_context, served_over_socket
from ts import async_service
from ts.service import PredictionException

from ts_compiled_handlers.servers.torchserve import adapter, async_worker
from ts_compiled_handlers.servers.torchserve.async_worker import AsyncWorker


class TimedMetrics:
    """Stands in for a context's metrics cache: keeps what `add_time` was told."""

    def __init__(self):
        self.times = []

    def add_time(self, name, value, idx=None, unit="ms"):
        self.times.append(name)


class Service:
    """What the worker loop serves: a loaded model's context and entry point (ts/service.py)."""

    def __init__(self, entry_point, metrics=None):
        self.context = make_context("/tmp/model", {"asyncCommunication": True}, batch_size=1)
        self.context.metrics = metrics
        self._entry_point = entry_point
        self.cl_socket = None


async def echo(data, context):
    """Each body back; the second request of a message refused, the way our adapter answers (two
    messages each: async_worker.send_first)."""
    await asyncio.sleep(0)
    for index, body in enumerate(data):
        context.set_response_content_type(index, "application/json")
        if body["body"].get("refuse"):
            context.set_response_status(400, "Bad Request", index)
    return async_worker.send_first([json.dumps(body["body"]).encode() for body in data], context)


def test_each_request_gets_its_answer_then_its_closing_message_and_the_worker_exits_when_the_frontend_leaves():
    metrics = TimedMetrics()
    messages = [frontend_message({f"r{i}": json.dumps({"n": i, "refuse": i == 3}).encode()}) for i in range(6)]
    sent, ended = served_over_socket(AsyncWorker, Service(echo, metrics), messages, answers=12)
    by_request = {}
    for message in sent:
        (answer,) = message  # one request per message, as the frontend sends under asyncCommunication
        by_request.setdefault(answer["id"], []).append(answer)
    assert sorted(by_request) == [f"r{i}" for i in range(6)]
    for request_id, (first, last) in by_request.items():
        refused = request_id == "r3"
        assert first["code"] == (400 if refused else 200)
        assert first["headers"].get("ts_stream_next") == (None if refused else "true")
        assert json.loads(first["body"])["n"] == int(request_id[1:])
        assert first["content_type"] == "application/json"
        assert (last["body"], last["headers"]["ts_stream_next"]) == (b"", "false")
    assert ended == {"exit": 0}  # as TorchServe's worker exits when its reader finds the socket closed
    assert metrics.times == ["PredictionTime"] * 6


@pytest.mark.parametrize(
    "error, code, phrase",
    [
        (ValueError("a handler bug"), 503, "Prediction failed"),
        (MemoryError(), 507, "Out of resources"),
        (PredictionException("nope", 418), 418, "nope"),
    ],
)
def test_a_failing_handler_gets_torchserves_status_and_the_loop_serves_on(error, code, phrase):
    calls = []

    async def fails_first(data, context):
        calls.append(len(data))
        if len(calls) == 1:
            raise error
        return await echo(data, context)

    messages = [frontend_message({"a": b'{"n": 1}'}), frontend_message({"b": b'{"n": 2}'})]
    sent, ended = served_over_socket(AsyncWorker, Service(fails_first), messages, answers=3)
    failed = [answer for message in sent for answer in message if answer["id"] == "a"]
    assert [(answer["code"], answer["body"]) for answer in failed] == [(code, b"error")]
    assert [answer["code"] for message in sent for answer in message if answer["id"] == "b"] == [200, 200]
    assert ended == {"exit": 0}


def test_a_handler_answering_the_wrong_count_gets_503():
    async def none_at_all(data, context):
        return []

    sent, _ = served_over_socket(AsyncWorker, Service(none_at_all), [frontend_message({"a": b"{}"})], answers=1)
    assert [(answer["code"], answer["body"]) for message in sent for answer in message] == [(503, b"error")]


def test_a_failing_thread_of_the_loop_is_returned_for_torchserve_to_raise(monkeypatch):
    def broken_reader(sock):
        raise OSError("the socket broke")

    monkeypatch.setattr("ts_compiled_handlers.servers.torchserve.messages.retrieve_msg", broken_reader)
    _, ended = served_over_socket(AsyncWorker, Service(echo), [], answers=0)
    assert "OSError: the socket broke" in ended["returned"]


def test_installed_only_in_torchserves_worker_of_the_release_it_mirrors(monkeypatch):
    worker_script = types.ModuleType("__main__")
    worker_script.TorchModelServiceWorker = object
    worker_script.AsyncService = async_service.AsyncService

    assert not adapter.serve_async_with_our_loop()  # pytest's __main__ is not TorchServe's worker

    monkeypatch.setitem(sys.modules, "__main__", worker_script)
    monkeypatch.setattr(adapter.importlib.metadata, "version", lambda name: "0.11.1")
    assert not adapter.serve_async_with_our_loop()  # a release whose loop it does not mirror
    assert worker_script.AsyncService is async_service.AsyncService

    monkeypatch.setattr(adapter.importlib.metadata, "version", lambda name: "0.12.0")
    assert adapter.serve_async_with_our_loop()
    assert worker_script.AsyncService is AsyncWorker

    worker_script.AsyncService = replaced = object()  # someone else's loop stays
    assert not adapter.serve_async_with_our_loop()
    assert worker_script.AsyncService is replaced
