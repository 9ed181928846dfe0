"""A Ray Serve replica's limits, without a cluster: a body held to `max_request_size` (413 before it
is all read), a full queue refusing before the body is read, requests read and tokenized off the
event loop, and the key stripped wherever it comes from."""

import asyncio
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.loops.scheduled_requests import ScheduledRequests
from ts_compiled_handlers.request.outcome import refusal
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.request.tokenizing import Accepted, Tokenized
from ts_compiled_handlers.runtime.metrics import MetricsSink
from ts_compiled_handlers.servers import inference_api
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.worker.messages import Reply

ray_serve = pytest.importorskip("ts_compiled_handlers.servers.ray.serve", reason="the ray extra")

KEY = "s3cret"
LIMIT = 1000


class Chunks:
    """A body arriving in chunks; counts how many were read."""

    def __init__(self, chunks: list[bytes]):
        self.chunks, self.read = chunks, 0

    async def __aiter__(self):
        for chunk in self.chunks:
            self.read += 1
            yield chunk


def read(chunks: Chunks, content_length: str | None) -> bytes:
    return asyncio.run(inference_api.read_body(chunks, content_length, LIMIT))


def test_a_body_over_the_limit_is_refused_before_it_is_all_read():
    stated = Chunks([b"x" * 600] * 4)
    with pytest.raises(RequestError) as refused:
        read(stated, "2400")
    assert refused.value.status == 413 and "1000 bytes" in refused.value.message and stated.read == 0
    chunked = Chunks([b"x" * 600] * 4)  # no Content-Length: cut off once past the limit
    with pytest.raises(RequestError, match="max_request_size"):
        read(chunked, None)
    assert chunked.read == 2
    lying = Chunks([b"x" * 600] * 4)  # a length under the limit does not let more in
    with pytest.raises(RequestError, match="max_request_size"):
        read(lying, "10")
    assert lying.read == 2
    with pytest.raises(RequestError, match="413|max_request_size"):
        read(Chunks([]), "9" * 5000)  # no 5000-digit integer is made of it
    with pytest.raises(RequestError, match="Content-Length"):
        read(Chunks([]), "-5")
    assert read(Chunks([b"a" * 500, b"b" * 500]), "1000") == b"a" * 500 + b"b" * 500


class FakeWorker:
    """A worker whose `accept` records the thread it ran in, and may wait for the test's go."""

    serving = SimpleNamespace(config=SimpleNamespace(scheduler=SimpleNamespace(call_tokens=64, max_queue=2, fill_ms=0)))
    engine = None
    metrics = MetricsSink()
    task = Task(parse({}))  # a text task: no images held
    tracer = None  # no spans (handler.tracing off)

    def __init__(self):
        self.read_in: list[str] = []
        self.go = threading.Event()
        self.go.set()
        self.went = []  # per request: whether `go` came while it was being read
        self.call = threading.Event()  # model calls wait for it (the test's go), if cleared
        self.call.set()

    @property
    def reader(self):  # it reads its requests itself
        return self

    def accept(self, incoming, index: int = 0, trace=None) -> Accepted:
        self.read_in.append(threading.current_thread().name)
        self.went.append(self.go.wait(timeout=10))  # a loop blocked by this wait could never say go
        return Accepted(0, SimpleNamespace(body=incoming.body, texts_field="inputs"), Tokenized([], [[1, 2, 3]]))

    def run(self, requests):
        self.call.wait(timeout=10)
        return [[] for _ in requests]

    def record_call(self, made) -> None:
        pass

    def reply(self, accepted, rows) -> Reply:
        return Reply(json.dumps({"body": accepted.request.body.decode()}))

    def refused(self, route, error, stage) -> Reply:
        refused = refusal(error, stage)
        return Reply(json.dumps(refused.body()), refused.status)


@pytest.fixture
def replica():
    """A replica of the token scheduler over a fake worker, as Serve calls it (without Ray)."""
    replica = object.__new__(ray_serve.ArchiveReplica.func_or_class)
    worker = FakeWorker()
    replica.worker, replica.loop = worker, ScheduledRequests(worker, SimpleNamespace(executor=ThreadPoolExecutor(1)))
    replica.name, replica.version, replica.key_digest = "m", "1.0", inference_api.key_digest(KEY)
    replica.max_request_size = LIMIT
    return replica


def http_request(chunks: list[bytes], path: str = "/predictions/m", length: bool = True):
    """A Starlette request as Serve hands it to the replica; (request, the chunks it has received)."""
    from starlette.requests import Request

    received = []

    async def receive():
        body = chunks[len(received)] if len(received) < len(chunks) else b""
        received.append(body)
        return {"type": "http.request", "body": body, "more_body": len(received) < len(chunks)}

    headers = [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]
    if length:
        headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}
    return Request(scope, receive), received


def answer(response) -> tuple[int, dict]:
    return response.status_code, json.loads(response.body)


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "chunked"])
def test_the_replica_answers_413_to_a_body_over_max_request_size_without_reading_it_all(replica, length):
    request, received = http_request([b"x" * 600] * 10, length=length)
    status, body = answer(asyncio.run(replica(request)))
    assert status == 413 and "max_request_size" in body["error"]
    assert len(received) == (0 if length else 2) and replica.worker.read_in == []
    request, _ = http_request([b"ok"])
    assert answer(asyncio.run(replica(request))) == (200, {"body": "ok"})


def test_a_full_queue_answers_503_before_reading_the_body_or_tokenizing(replica):
    replica.worker.call.clear()

    async def scenario():
        held = [asyncio.ensure_future(replica(http_request([f"r{i}".encode()])[0])) for i in range(2)]
        while replica.loop.scheduler.held < 2:  # both queued or in the call, which waits for the test
            await asyncio.sleep(0.01)
        late, received = http_request([b"late"])
        refused = answer(await replica(late))
        replica.worker.call.set()
        return refused, received, [answer(response) for response in await asyncio.gather(*held)]

    (status, body), received, answered = asyncio.run(scenario())
    assert status == 503 and "max_queue" in body["error"] and received == []
    assert len(replica.worker.read_in) == 2 and [code for code, _ in answered] == [200, 200]


def test_a_request_is_read_and_tokenized_off_the_event_loop(replica):
    replica.worker.go.clear()

    async def scenario():
        slow = asyncio.ensure_future(replica(http_request([b"slow"])[0]))
        while not replica.worker.read_in:
            await asyncio.sleep(0.01)
        ping = await replica(http_request([], path="/ping")[0])  # answered while it is read
        replica.worker.go.set()
        return ping.status_code, answer(await slow)

    ping, slow = asyncio.run(scenario())
    assert ping == 200 and slow == (200, {"body": "slow"})
    assert replica.worker.went == [True] and "request-reader" in replica.worker.read_in[0]


# -- the key --------------------------------------------------------------------------------------
def test_keys_from_the_environment_and_the_file_are_stripped(monkeypatch, tmp_path):
    monkeypatch.setenv(ray_serve.KEY_ENV, f"{KEY}\n")  # a Secret made with --from-file
    assert ray_serve.api_key(None, "m") == KEY
    monkeypatch.setenv(ray_serve.KEY_ENV, " \n")  # blank: not a key, the file's is used
    path = tmp_path / "m.key"
    path.write_text(f"{KEY}\r\n")
    path.chmod(0o600)
    assert ray_serve.api_key(str(path), "m") == KEY
    digest = inference_api.key_digest(ray_serve.api_key(str(path), "m"))
    assert inference_api.authorized(f"Bearer {KEY}", digest)


def test_a_key_file_others_can_read_is_used_with_a_warning_and_an_empty_one_refused(monkeypatch, caplog, tmp_path):
    monkeypatch.delenv(ray_serve.KEY_ENV, raising=False)
    path = tmp_path / "m.key"
    path.write_text(KEY)
    path.chmod(0o640)
    with caplog.at_level(logging.WARNING):
        assert ray_serve.api_key(str(path), "m") == KEY
    assert "chmod 600" in caplog.text and "640" in caplog.text and KEY not in caplog.text
    caplog.clear()
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        ray_serve.api_key(str(path), "m")
    assert "chmod" not in caplog.text
    path.write_text("\n")
    with pytest.raises(ValueError, match="holds no key"):
        ray_serve.api_key(str(path), "m")
    assert os.stat(path).st_size == 1  # left as it was


def test_the_builder_takes_max_request_size_and_passes_it_to_each_replica():
    assert ray_serve.AppArgs(archive="a.mar").max_request_size == inference_api.MAX_REQUEST_SIZE == 6_553_500
    assert ray_serve.AppArgs(archive="a.mar", max_request_size=10).max_request_size == 10
    with pytest.raises(ValueError):
        ray_serve.AppArgs(archive="a.mar", max_request_size=0)
