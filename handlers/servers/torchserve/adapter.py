"""The TorchServe adapter: the only code that reads or writes TorchServe's context.

Every `.mar` our build makes names the one handler file (handlers/servers/torchserve/handler.py), a
subclass of this class; the task is the archive's (`handler.task` in its model-config.yaml).
`initialize` builds the worker (handlers/worker/worker.py) from what the context says (a `Placement`)
and starts its loop (handlers/loops/start.py), which says its kind; the way `handle` answers follows
from that kind, chosen once. `handle` turns `(data, context)` into `Incoming` requests, hands them to
the loop, and writes the replies back: status, content type and headers in, answers out. The loops:
- request batches (handlers/loops/request_batches.py): `handle` drives preprocess / inference /
  postprocess, each overridable the way TorchServe's docs teach; generation's own
  (handlers/loops/generation_batches.py) streams through TorchServe's intermediate responses;
- `continuousBatching: true`: the decode loop (handlers/loops/decode_loop.py), `ts_stream_next` per reply;
- `asyncCommunication: true`: the scheduled loop (handlers/loops/scheduled_requests.py), answers sent through the
  async worker's out-queue (handlers/servers/torchserve/async_worker.py).
"""

import importlib.metadata
import logging
import sys
from typing import Any

from ts import async_service
from ts.handler_utils.utils import send_intermediate_predict_response
from ts.protocol import otf_message_handler
from ts.torch_handler.base_handler import BaseHandler

from ts_compiled_handlers.configuration.config import HandlerConfig, parse
from ts_compiled_handlers.configuration.placement import Loop, Placement
from ts_compiled_handlers.loops.request_batches import Batch
from ts_compiled_handlers.loops.start import start
from ts_compiled_handlers.request.payload import phrase
from ts_compiled_handlers.runtime.tracing import TRACE_HEADERS
from ts_compiled_handlers.servers.torchserve import async_worker, messages, settings
from ts_compiled_handlers.servers.torchserve.metrics_sink import TorchServeSink
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.registry import task_class
from ts_compiled_handlers.worker.messages import Incoming, Reply
from ts_compiled_handlers.worker.worker import Worker

logger = logging.getLogger(__name__)
KNOWN_RELEASES = ("0.12.",)  # the TorchServe releases whose frames (messages.py) and async loop ours mirror
READER_MODULES = ("__main__", "ts.async_service")  # the worker's script and its async loop hold the reader


class TorchServeHandler(BaseHandler):
    """Serves the worker of the task the archive names under TorchServe. A subclass may name a
    subclass of that task's class (`task_class`), to add a protocol."""

    task_class: type[Task] | None = None  # None: the archive's task's class (handlers/tasks/registry.py)
    worker_class: type[Worker] = Worker
    warmup_progress = None  # called as warmup_progress(done, total) after each shape (the build's bar)

    @classmethod
    def served_task(cls, config: HandlerConfig) -> type[Task]:
        """The task class this handler serves the archive's `config` with (the build's precompile
        step and Ray ask the same)."""
        return cls.task_class or task_class(config.task)

    def initialize(self, context):
        """The worker built, warmed, checked (under asyncCommunication in its model thread), then its loop."""
        self.context = context
        placement = Placement(
            context.system_properties["model_dir"],
            context.model_name,
            context.model_yaml_config or {},
            (context.manifest or {}).get("model", {}).get("modelVersion"),
            context.system_properties.get("batch_size"),
            context.system_properties.get("gpu_id"),
        )
        config = parse(placement.yaml_config)  # once per worker
        served = self.served_task(config)
        sink = TorchServeSink(context)
        quiet_per_batch_lines()
        self.worker, self.loop = start(
            settings.placed(placement, served.NAME),
            config,
            served,
            sink,
            self.worker_class,
            self.warmup_progress,
            self.send_chunks,
        )
        sink.declare_traffic_metrics()
        read_messages_from_memory()
        if self.loop.kind is Loop.SCHEDULED:
            serve_async_with_our_loop()
            self.answer = self.answer_one_at_a_time
        elif self.loop.kind is Loop.DECODE_LOOP:
            self.answer = self.answer_decode_call
        else:
            self.answer = self.answer_in_steps
        self.initialized = True

    def handle(self, data, context):
        """One reply per request, in order; a request's failure is its own reply. Never raises.
        Under asyncCommunication, a coroutine TorchServe awaits."""
        self.context = context
        return self.answer(data, context)

    def answer_one_at_a_time(self, data, context):
        """asyncCommunication: each request handed to the loop as it came; what it yields, written."""
        pending = [self.loop.serve(self.incoming(index, body)) for index, body in enumerate(data)]
        return answer_when_done(pending, context)

    def answer_decode_call(self, data, context) -> list:
        """continuousBatching: the requests TorchServe holds (new ones with bodies, running ones
        resent) in one call of the decode loop; each reply says whether its request is done."""
        ids = context.request_ids
        requests = [(ids[index], self.resent_or_incoming(index, body)) for index, body in enumerate(data)]
        try:
            replies = self.loop.call(requests)
        except Exception as error:  # a defect past the loop's own boundaries: still answer everyone
            replies = [self.worker.refused("", error, "handle") for _ in data]
        return write(replies, context, stream_next=True)

    def answer_in_steps(self, data, context) -> list:
        """Request batches: TorchServe's three steps, each overridable."""
        try:
            batch = self.inference(self.preprocess(data))
            replies = self.loop.replies(batch, self.postprocess(batch))
        except Exception as error:  # a defect past every per-request boundary: still answer everyone
            replies = self.loop.fail_all([Incoming(None) for _ in data], error)
        return write(replies, context)

    # -- the steps of request batches, overridable ---------------------------------------------
    def preprocess(self, data) -> Batch:
        return self.loop.preprocess([self.incoming(index, body) for index, body in enumerate(data)])

    def inference(self, data: Batch, *args, **kwargs) -> Batch:
        return self.loop.inference(data)

    def postprocess(self, data: Batch) -> list[Any]:
        return self.loop.postprocess(data)

    # -- TorchServe's context, read ----------------------------------------------------------------
    def incoming(self, index: int, request: dict) -> Incoming:
        """Request `index` of the batch: its body, content type and `url_path` (the route)."""
        body = request.get("data") if request.get("data") is not None else request.get("body")
        header = self.header(index, "data" if request.get("data") is not None else "body")
        content_type = header.get("content-type") if isinstance(header, dict) else None
        route = (self.header(index, "url_path") or "").strip("/")
        return Incoming(body, content_type, route, self.trace_context(index) if self.worker.tracer else None)

    def trace_context(self, index: int) -> dict[str, str]:
        """The caller's W3C trace headers (the frontend hands the HTTP headers on with each request)."""
        found = {name: self.header(index, name) for name in TRACE_HEADERS}
        return {name: value for name, value in found.items() if isinstance(value, str)}

    def resent_or_incoming(self, index: int, request: dict) -> Incoming | None:
        """None for a request the frontend resends (no body, no headers: continuous batching)."""
        if not request and not self.context.request_processor[index].get_request_properties():
            return None
        return self.incoming(index, request)

    def header(self, index: int, name: str) -> Any:
        return self.context.get_request_header(index, name) if self.context.request_processor else None

    def send_chunks(self, batch: Batch, chunks: dict[int, str]) -> None:
        """Streamed text, through TorchServe's intermediate responses."""
        for index in chunks:
            self.context.set_response_content_type(index, batch.replies[index].content_type)
        request_ids = {index: self.context.request_ids[index] for index in chunks}
        send_intermediate_predict_response(chunks, request_ids, "Intermediate Prediction success", 200, self.context)

    # -- what tools and tests read of the worker ---------------------------------------------------
    engine = property(lambda self: self.worker.engine)
    serving = property(lambda self: self.worker.serving)
    started = property(lambda self: self.worker.started)
    threads = property(lambda self: self.worker.threads)
    lengths = property(lambda self: self.worker.lengths)
    tokenize = property(lambda self: self.worker.reader.tokenize)
    tokenizer = property(lambda self: self.worker.serving.tokenizer)
    config = property(lambda self: self.worker.serving.config)
    model_source = property(lambda self: self.worker.model_source)


class PerBatchLines(logging.Filter):
    """TorchServe's worker logs a line for every batch it receives ("Backend received inference
    at: ..."), which the frontend reads from its stdout and the package's log4j2.xml then drops:
    dropped here instead, before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.module == "otf_message_handler" and str(record.msg).startswith("Backend received"))


def quiet_per_batch_lines() -> None:
    """The worker's root logger (TorchServe logs through it) without its per-batch line; once per process."""
    root = logging.getLogger()
    if not any(isinstance(each, PerBatchLines) for each in root.filters):
        root.addFilter(PerBatchLines())


def known_torchserve_worker() -> bool:
    """In TorchServe's worker process, of a release whose frames (messages.py) and async loop
    (async_worker.py) ours mirror; False in process (tests, Ray, tools)."""
    if not hasattr(sys.modules["__main__"], "TorchModelServiceWorker"):
        return False
    try:
        release = importlib.metadata.version("torchserve")
    except importlib.metadata.PackageNotFoundError:
        return False
    if not release.startswith(KNOWN_RELEASES):
        logger.info("TorchServe %s: its own message reader and async loop kept (ours know %s)", release, KNOWN_RELEASES)
        return False
    return True


def read_messages_from_memory() -> bool:
    """The worker's loops read the frontend's messages through messages.py instead of TorchServe's
    reader (called once the model is loaded, before the next message is read); False outside a
    `known_torchserve_worker`, or where something else already replaced TorchServe's reader."""
    if not known_torchserve_worker():
        return False
    modules = [sys.modules[name] for name in READER_MODULES if name in sys.modules]
    loops = [module for module in modules if getattr(module, "retrieve_msg", None) is otf_message_handler.retrieve_msg]
    for module in loops:
        module.retrieve_msg = messages.retrieve_msg
    if loops:
        logger.info("TorchServe's messages are read by %s", messages.__name__)
    return bool(loops)


def serve_async_with_our_loop() -> bool:
    """asyncCommunication: TorchServe's async loop (ts/async_service.py) replaced by ours
    (async_worker.py), which the worker starts once `initialize` returns; False outside a
    `known_torchserve_worker`, or where something else already replaced it."""
    main = sys.modules["__main__"]
    if not known_torchserve_worker() or getattr(main, "AsyncService", None) is not async_service.AsyncService:
        return False
    main.AsyncService = async_worker.AsyncWorker
    logger.info("TorchServe's async requests are served by %s", async_worker.__name__)
    return True


def write(replies: list[Reply], context, stream_next: bool = False) -> list:
    """The replies' statuses, content types and headers into the context; their bodies returned.
    `stream_next`: each reply's `last` becomes its `ts_stream_next` header (None: none)."""
    for index, reply in enumerate(replies):
        if reply.status != 200:
            context.set_response_status(reply.status, phrase(reply.status), index)
        context.set_response_content_type(index, reply.content_type)
        for name, value in reply.headers.items():
            context.set_response_header(index, name, value)
    if stream_next:
        context.stopping_criteria = [lambda _, last=reply.last: last for reply in replies]
    return [reply.body for reply in replies]


async def answer_when_done(pending: list, context) -> list:
    """Each request's last reply (a loop that answers one at a time yields one each), first sent
    through the async worker's out-queue."""
    replies = [await last_reply(each) for each in pending]  # TorchServe 0.12 hands one request here (batchSize 1)
    return async_worker.send_first(write(replies, context), context)


async def last_reply(replies) -> Reply:
    """The last of what a loop yields for one request (a loop's `serve` never raises)."""
    async for reply in replies:
        last = reply
    return last
