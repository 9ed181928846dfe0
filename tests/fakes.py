"""Stand-ins for TorchServe's parts, for unit tests that drive a handler in process."""

import asyncio
import copy
import json
import socket
import struct
import threading

from ts.context import Context, RequestProcessor
from ts.protocol.otf_message_handler import create_predict_response

from ts_compiled_handlers.benchmarks.in_process import build_aot_package, make_context, ready_handler, start_batch  # noqa: F401 (shared with the benchmarks)


def status(context: Context, index: int) -> int:
    return context.get_response_status(index)[0] or 200


def decoded(answers: list, context: Context) -> list:
    """`handle`'s answers as a client reads them: JSON bodies parsed, others (JSON lines) as text."""
    return [
        json.loads(answer) if context.get_response_content_type(index) == "application/json" else answer
        for index, answer in enumerate(answers)
    ]


def answered(handler, bodies: list, content_types: list[str] | None = None) -> list:
    """One batch of request bodies through `handle`, as TorchServe calls it; the parsed answers."""
    start_batch(handler.context, content_types or ["application/json"] * len(bodies))
    return decoded(handler.handle([{"body": body} for body in bodies], handler.context), handler.context)


class RecordingSocket:
    """Stands in for the worker's socket to the frontend: keeps what intermediate responses send."""

    def __init__(self):
        self.messages: list[bytes] = []

    def sendall(self, message) -> None:
        self.messages.append(bytes(message))


class RecordingMetrics:
    """Stands in for a context's metrics cache: keeps (name, value, dimensions, metric type) per call."""

    def __init__(self):
        self.calls = []

    def add_metric(self, name, value, unit, dimensions, metric_type):
        self.calls.append((name, value, {d.name: d.value for d in dimensions}, metric_type.name))


class Frontend:
    """New requests go in with their bodies, running ones again without; a request leaves with the
    answer whose ts_stream_next is false, or when its client goes. A plain answer (no header) keeps
    it too while the connection is open, as TorchServe does."""

    def __init__(self, handler):
        self.handler = handler
        self.queue: dict[str, dict | None] = {}  # request id -> body until first sent, then None
        self.received: dict[str, list[str]] = {}
        self.statuses: dict[str, int] = {}
        self.finished_at: dict[str, int] = {}
        self.calls = 0

    def submit(self, request_id: str, body: dict) -> None:
        self.queue[request_id] = body
        self.received[request_id] = []

    def cancel(self, request_id: str) -> None:
        del self.queue[request_id]

    def call(self) -> None:
        ids = list(self.queue)
        context = self.handler.context
        # A resent request comes without its headers and parameters (the frontend's request encoder).
        headers = [{} if self.queue[rid] is None else {"body": {"content-type": "application/json"}} for rid in ids]
        context.request_processor = [RequestProcessor(properties) for properties in headers]
        context.request_ids = dict(enumerate(ids))
        data = [{} if self.queue[rid] is None else {"body": self.queue[rid]} for rid in ids]
        answers = self.handler.handle(data, context)
        self.calls += 1
        assert len(answers) == len(ids)
        for index, request_id in enumerate(ids):
            if self.queue[request_id] is not None:  # the first answer sends the status
                self.statuses[request_id] = status(context, index)
            self.received[request_id].append(answers[index])
            last = context.stopping_criteria[index](answers[index])
            first = self.queue[request_id] is not None
            assert last is not True or not first, "a first answer saying false would go out without a status line"
            assert last is not None or (first and self.statuses[request_id] >= 400), "only refusals go plain"
            if last is True:
                del self.queue[request_id]
                self.finished_at[request_id] = self.calls
            else:
                self.queue[request_id] = None

    def run(self) -> None:
        while self.queue:
            self.call()

    def body(self, request_id: str) -> str:
        return "".join(self.received[request_id])


def read_predict_response(message: bytes) -> list[dict]:
    """The answers of one worker message as the frontend's ModelResponseDecoder reads them."""
    answers, _ = read_message(memoryview(message), 0)
    return answers


def read_predict_stream(stream: bytes) -> list[list[dict]]:
    """Each whole worker message of `stream` (what the frontend's socket received), read."""
    view, at, found = memoryview(stream), 0, []
    while at < len(stream):
        try:
            answers, at = read_message(view, at)
        except struct.error:  # the rest has not arrived yet
            break
        found.append(answers)
    return found


def read_message(view: memoryview, at: int) -> tuple[list[dict], int]:
    """The answers of the worker message at `at`, and where the next one starts."""

    def integer() -> int:
        nonlocal at
        (value,) = struct.unpack_from("!i", view, at)
        at += 4
        return value

    def text(size: int | None = None) -> bytes:
        nonlocal at
        size = integer() if size is None else size
        if at + size > len(view):
            raise struct.error("cut short")
        at += size
        return bytes(view[at - size : at])

    integer(), text()  # the message's code and phrase
    answers = []
    while (size := integer()) != -1:
        request_id = text(size).decode()
        content_type, code, phrase = text().decode(), integer(), text().decode()
        headers = {text().decode(): text().decode() for _ in range(integer())}
        answers.append(
            {
                "id": request_id,
                "content_type": content_type,
                "code": code,
                "phrase": phrase,
                "headers": headers,
                "body": text(),
            }
        )
    return answers, at


class AsyncWorker:
    """Stands in for ts/async_service.py's AsyncService: each request's `handle` awaited in a task
    of its own (`call_predict`, its context a deep copy of the handler's), every message into one
    out-queue in the order they are put there."""

    def __init__(self, handler):
        self.handler = handler
        self.out_queue = asyncio.Queue()

    async def call_predict(self, request_id: str, body, content_type: str = "application/json") -> None:
        context = copy.deepcopy(self.handler.context)
        context.request_ids = {0: request_id}
        context.request_processor = [RequestProcessor({"body": {"content-type": content_type}})]
        answers = await self.handler.handle([{"body": body}], context)
        await self.out_queue.put(create_predict_response(answers, context.request_ids, "ok", 200, context=context))

    async def serve(self, requests: dict[str, object]) -> dict[str, list[dict]]:
        """Every request (id: body) sent at once; each one's messages, in the order they were sent."""
        await asyncio.gather(*(asyncio.create_task(self.call_predict(rid, body)) for rid, body in requests.items()))
        sent: dict[str, list[dict]] = {rid: [] for rid in requests}
        while not self.out_queue.empty():
            for answer in read_predict_response(self.out_queue.get_nowait()):
                sent[answer["id"]].append(answer)
        return sent


def as_client_sees(messages: list[dict]) -> tuple[int, bytes]:
    """(status, body) of a request answered the async way: a served one "true" then an empty
    "false"; a refused one plain (no header) then the empty "false" that clears it."""
    first, last = messages
    assert last["headers"].get("ts_stream_next") == "false" and last["body"] == b""
    streamed = first["headers"].get("ts_stream_next")
    assert streamed == ("true" if first["code"] < 400 else None), first
    return first["code"], first["body"]


# The first lines of a script run in a process where TorchServe cannot be imported (a Ray replica's
# node, the lent GPU machine): any `import ts...` after them raises ImportError.
NO_TORCHSERVE = """
import importlib.abc, sys

class NoTorchServe(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ts" or name.startswith("ts."):
            raise ImportError(f"{name}: TorchServe is not importable in this process")

sys.meta_path.insert(0, NoTorchServe())
"""


def sized(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def frontend_message(requests: dict[str, bytes], content_type: str = "application/json") -> bytes:
    """One predict message as TorchServe's frontend encodes it: each request's id, no header, its body."""
    end = struct.pack("!i", -1)
    frames = [
        sized(rid.encode()) + end + sized(b"body") + sized(content_type.encode()) + sized(body) + end
        for rid, body in requests.items()
    ]
    return b"I" + b"".join(frames) + end


def served_over_socket(loop_class, service, messages: list[bytes], answers: int) -> tuple[list[list[dict]], dict]:
    """`messages` sent to `loop_class(service).run()` (an async worker loop) over a real socket pair,
    read until `answers` answers came back, then the frontend gone: every message the worker
    wrote, read, and how its `run` ended once the frontend left ({"returned": ...} or {"exit": code})."""
    frontend, worker_end = socket.socketpair()
    service.cl_socket = worker_end
    ended = {}

    def run():
        try:
            ended["returned"] = loop_class(service).run()
        except SystemExit as exit:
            ended["exit"] = exit.code

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    frontend.sendall(b"".join(messages))
    frontend.settimeout(30)
    stream = b""
    while sum(map(len, read_predict_stream(stream))) < answers:
        stream += frontend.recv(1 << 16)
    frontend.close()
    thread.join(30)
    worker_end.close()
    assert not thread.is_alive(), "the worker loop did not end when the frontend left"
    return read_predict_stream(stream), ended
