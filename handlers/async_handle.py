"""`handle` under TorchServe's `asyncCommunication: true`: each request answered as soon as its call is done.

TorchServe 0.12's async worker (ts/async_service.py) awaits `handle(data, context)` for every
message of the frontend (one request, with `batchSize: 1`), all on one event loop, concurrently.
Here a request is decoded and tokenized on the loop as it arrives (the handler's `preprocess`),
queued in the token scheduler (handlers/scheduler.py), and answered by the handler's `postprocess`
once the call that took it is done. A queue at `scheduler.max_queue` answers 503 at once.

`preprocess` and `postprocess` read `handler.context`; each request sets it to its own context
right before each of them, and neither awaits, so no other request's coroutine runs in between.

How an answer must leave, as TorchServe 0.12's frontend treats it (AsyncBatchAggregator,
RestJob.responseInference):
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
import logging
from typing import Any

from ts.protocol.otf_message_handler import create_predict_response

from ts_compiled_handlers.batch import Accepted, Batch
from ts_compiled_handlers.payload import RequestError
from ts_compiled_handlers.scheduler import TokenScheduler

logger = logging.getLogger(__name__)

FULL = "the server is at its queue limit (scheduler.max_queue); retry shortly"


async def handle(handler, data: list, context) -> list[str]:
    """The answers of one message, the first of each sent at once; returns the closing ones. Never
    raises: TorchServe would answer every request in flight on the worker with its 503."""
    try:
        handler.context = context
        batch = handler.preprocess(data)
        await run(handler.scheduler, batch)
        handler.context = context
        answers = batch.as_json(handler.postprocess(batch))
    except Exception as error:  # a defect past every per-request boundary: still answer everyone
        batch = Batch.of(len(data), context)
        for index in range(len(data)):
            batch.fail(index, "handle", error)
        answers = batch.as_json(batch.answers)
    try:
        return send_first(answers, context)
    except Exception:  # answered plain instead: the frontend keeps them (a leak), but each has its answer
        logger.exception("Could not send %d answers the async way; sending them plain", len(answers))
        context.stopping_criteria = None
        for index in range(len(answers)):
            context.get_response_headers(index).pop("ts_stream_next", None)
        return answers


async def run(scheduler: TokenScheduler, batch: Batch) -> None:
    """Each accepted request through the scheduler; a full queue refuses it with 503."""

    async def one(accepted: Accepted) -> None:
        with batch.guard(accepted.index, "inference"):
            if scheduler.full:
                raise RequestError(503, FULL)
            batch.outputs[accepted.index] = await scheduler.submit(accepted, accepted.tokens)

    await asyncio.gather(*(one(accepted) for accepted in batch.live(batch.accepted)))


def send_first(answers: list, context) -> list[str]:
    """Put every answer on the wire now (served: "true"; refused: plain), and return the closing
    empty "false" answers for TorchServe to send after them (see the module docstring)."""
    served = [(context.get_response_status(index)[0] or 200) < 400 for index in range(len(answers))]
    context.stopping_criteria = [lambda _, ok=ok: False if ok else None for ok in served]
    message = create_predict_response(answers, context.request_ids, "Prediction success", 200, context=context)
    OUT.put(message)
    context.stopping_criteria = [lambda _: True for _ in answers]
    return [""] * len(answers)


class OutQueue:
    """The async worker's out-queue, found from the running task (`AsyncService.call_predict`).
    Without it an answer goes plain (`handle`'s fallback): writing to the socket from here would
    race the worker's sender thread and could interleave two messages."""

    def put(self, message: Any) -> None:
        queue = self.find()
        if queue is None:
            raise LookupError("no async out-queue found (not TorchServe 0.12's async worker?)")
        queue.put_nowait(message)

    @staticmethod
    def find() -> asyncio.Queue | None:
        task = asyncio.current_task()
        frame = getattr(task.get_coro(), "cr_frame", None) if task is not None else None
        service = frame.f_locals.get("self") if frame is not None else None
        queue = getattr(service, "out_queue", None)
        return queue if isinstance(queue, asyncio.Queue) else None


OUT = OutQueue()
