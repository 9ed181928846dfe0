"""TorchServe 0.12's async worker loop (ts/async_service.py), without its per-request costs.

Under `asyncCommunication: true`, TorchServe's worker hands every request through four threads: a
reader puts it in a queue, a batching thread polls that queue (with timeouts) and posts a coroutine
to the event loop, the coroutine deep-copies the worker's context and prints a line to stdout (which
the frontend reads and logs), and a sender thread fetches each answer back from the event loop
with a cross-thread future before writing it. Measured through TorchServe on 2 cores (MiniLM, 16
and 32 clients, docs/performance.md "Scheduling by tokens"), that machinery cost the worker about
3 ms of Python per request, on the same two cores as the model's OpenMP team.

This loop does the same job with two threads beside the event loop: the reader posts each message
straight to the loop, the request's context is a shallow copy (the handler writes only the
request's own `request_processor` and `stopping_criteria`, which are the copy's), and a writer
thread sends what the loop queued, all that waits in one write. What the frontend receives is
TorchServe's: the same messages, made by TorchServe's `create_predict_response`, in the same order
per request, with the same statuses for a failing handler (507 out of memory, a
`PredictionException`'s own, 503 otherwise). The adapter puts it in place of TorchServe's
(handlers/servers/torchserve/adapter.py, `serve_async_with_our_loop`) only for the release whose
loop it mirrors.

How an answer must leave (`send_first`), as TorchServe 0.12's frontend treats it:
- the frontend forgets a request only on an answer whose `ts_stream_next` header is "false";
  one without the header is answered but kept forever (a leak, and never retried);
- an answer saying "false" first would send no status line, so a served request gets two
  messages: its body with "true" (status, headers and the body as a chunk), then "" with "false"
  (the last chunk);
- an error status makes the frontend close the connection once its headers are out, which would
  cut a chunked body short: a refusal is one plain answer (its status, no header), then the same
  empty "false", which only clears it from the frontend (its writes fall on a closed connection).
The first message goes into the async worker's own out-queue, the one its single sender thread
writes from (the second is `handle`'s return, which goes there too), so no two messages
interleave on the socket; TorchServe's `send_intermediate_predict_response` writes from the calling
thread instead, racing that sender on large answers.
"""

import asyncio
import copy
import logging
import queue
import threading
import time
import traceback

from ts.protocol.otf_message_handler import create_predict_response
from ts.service import PREDICTION_METRIC, PredictionException, Service

from ts_compiled_handlers.servers.torchserve import messages

logger = logging.getLogger(__name__)
PREDICT = b"I"


class Wire:
    """What the event loop writes to the frontend: queued here, sent by the writer thread. It
    stands where TorchServe's async out-queue stands (handlers/servers/torchserve/`send_first` puts
    answers in it)."""

    def __init__(self):
        self.pending: queue.SimpleQueue = queue.SimpleQueue()

    def put_nowait(self, message: bytes | None) -> None:
        if message is not None:  # TorchServe's responses are None on ranks other than 0
            self.pending.put(message)

    def send_forever(self, sock) -> None:
        """Send what is queued, every message that waits in one `sendall`, until the socket fails."""
        while True:
            chunks = [self.pending.get()]
            while not self.pending.empty():
                chunks.append(self.pending.get_nowait())
            sock.sendall(b"".join(chunks))


class AsyncWorker:
    """Serves one loaded `ts.service.Service` as TorchServe 0.12's `AsyncService` does."""

    def __init__(self, service):
        self.service = service
        self.out_queue = Wire()  # the attribute `out_queue()` looks for
        self.loop: asyncio.AbstractEventLoop | None = None
        self.failure: str | None = None
        self.answering: set[asyncio.Task] = set()  # held: the loop keeps only weak references to tasks

    def run(self) -> str | None:
        """Serve until the frontend leaves (then exit, as TorchServe's worker does when its reader
        finds the socket closed) or a thread of the loop fails: that failure's traceback (TorchServe's
        worker raises it and exits, as it does for its own loop's)."""
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        for name, work in (("requests", self.receive), ("answers", self.send)):
            threading.Thread(target=self.until_it_ends, args=(work,), name=f"async-{name}", daemon=True).start()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()
        if self.failure is None:
            raise SystemExit(0)
        return self.failure

    def until_it_ends(self, work) -> None:
        """`work()` in its thread; its end, whatever ends it, stops the event loop."""
        failure = None  # SystemExit: the reader found the frontend gone
        try:
            work()
        except Exception:
            failure = traceback.format_exc()
            logger.error("The async worker's %s thread failed: %s", threading.current_thread().name, failure)
        finally:
            try:
                self.loop.call_soon_threadsafe(self.stop, failure)
            except RuntimeError:  # the loop is closed: the other thread's end stopped it
                pass

    def stop(self, failure: str | None) -> None:
        self.failure = self.failure or failure
        self.loop.stop()

    def receive(self) -> None:
        """Each predict message posted to the event loop as it is read."""
        sock = self.service.cl_socket
        while True:
            command, message = messages.retrieve_msg(sock)
            if command == PREDICT:
                self.loop.call_soon_threadsafe(self.start_predict, message)
            else:
                logger.debug("Unexpected message from the frontend: %r", command)

    def send(self) -> None:
        self.out_queue.send_forever(self.service.cl_socket)

    def start_predict(self, batch: list) -> None:
        task = self.loop.create_task(self.call_predict(batch))
        self.answering.add(task)
        task.add_done_callback(self.answering.discard)

    async def call_predict(self, batch: list) -> None:
        """One message's requests answered (named as TorchServe's, whose frame `out_queue()` reads)."""
        self.out_queue.put_nowait(await self.predict(batch))

    async def predict(self, batch: list) -> bytes | None:
        """The handler's answer to one message as TorchServe's `predict` makes it."""
        headers, input_batch, request_ids = Service.retrieve_data_for_inference(batch)
        context = copy.copy(self.service.context)
        context.request_ids = request_ids
        context.request_processor = headers
        context.stopping_criteria = None
        began = time.time()
        try:
            answers = await self.service._entry_point(input_batch, context)
        except MemoryError:
            logger.error("System out of memory", exc_info=True)
            return create_predict_response(None, request_ids, "Out of resources", 507)
        except PredictionException as error:
            logger.error("Prediction error", exc_info=True)
            return create_predict_response(None, request_ids, error.message, error.error_code)
        except Exception:
            logger.warning("Invoking custom service failed.", exc_info=True)
            return create_predict_response(None, request_ids, "Prediction failed", 503)
        if not isinstance(answers, list) or len(answers) != len(input_batch):
            logger.warning("The handler answered %d requests with %r", len(input_batch), type(answers))
            return create_predict_response(None, request_ids, "Invalid model predict output", 503)
        if context.metrics is not None:  # the line names the request, as TorchServe's own does
            context.metrics.request_ids = request_ids
            context.metrics.add_time(PREDICTION_METRIC, round((time.time() - began) * 1000, 2))
        return create_predict_response(answers, request_ids, "Prediction success", 200, context=context)


def send_first(answers: list, context) -> list[str]:
    """Put every answer on the wire now (served: "true"; refused: plain), and return the closing
    empty "false" answers for TorchServe to send after them. Without the out-queue the answers go
    plain instead: the frontend then keeps them (a leak), but each has its answer."""
    served = [(context.get_response_status(index)[0] or 200) < 400 for index in range(len(answers))]
    try:
        queue = out_queue()
        context.stopping_criteria = [lambda _, ok=ok: False if ok else None for ok in served]
        queue.put_nowait(
            create_predict_response(answers, context.request_ids, "Prediction success", 200, context=context)
        )
    except Exception:  # loud: logged with its traceback
        logger.exception("Could not send %d answers the async way; sending them plain", len(answers))
        context.stopping_criteria = None
        for index in range(len(answers)):
            context.get_response_headers(index).pop("ts_stream_next", None)
        return answers
    context.stopping_criteria = [lambda _: True for _ in answers]
    return [""] * len(answers)


def out_queue() -> asyncio.Queue | Wire:
    """The async worker's out-queue (ours: `Wire`). ts/async_service.py offers no
    supported way to it: it is an attribute of its `AsyncService`, whose `call_predict` coroutine runs
    the current task, so it is read from that coroutine's frame (ours has the same shape).
    tests/unit/test_ts_async.py fails loudly if that shape changes."""
    task = asyncio.current_task()
    frame = getattr(task.get_coro(), "cr_frame", None) if task is not None else None
    service = frame.f_locals.get("self") if frame is not None else None
    queue = getattr(service, "out_queue", None)
    if not isinstance(queue, (asyncio.Queue, Wire)):
        raise LookupError("no async out-queue found: not TorchServe 0.12's AsyncService.call_predict?")
    return queue
