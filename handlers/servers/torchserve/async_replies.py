"""Answers under TorchServe's `asyncCommunication: true`: how each must leave the worker.

TorchServe 0.12's async worker (ts/async_service.py) awaits `handle(data, context)` for every
message of the frontend (one request, with `batchSize: 1`), all on one event loop, concurrently.
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

from ts.protocol.otf_message_handler import create_predict_response

from ts_compiled_handlers.servers.torchserve.async_worker import Wire

logger = logging.getLogger(__name__)


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
    """The async worker's out-queue (ours: async_worker.py's `Wire`). ts/async_service.py offers no
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
