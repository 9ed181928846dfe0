"""The scheduled loop: each request answered as soon as the model call that took it is done.

Where a server hands requests over one at a time, as they arrive, on an event loop (TorchServe's
`asyncCommunication: true`, a Ray Serve replica), a request is read and tokenized in the reader
thread, queued in the token scheduler (handlers/loops/token_scheduler.py), and answered once its
call is done; model work runs in the worker's one model thread (handlers/loops/model_thread.py). A
queue at `scheduler.max_queue` (requests being read count) answers 503 at once, before any reading;
a request whose images or per-token output rows would pass what the worker may hold
(`images.batch_images`, `handler.max_held_bytes`: handlers/request/holding.py) gets its 503 (413
where it alone passes it) once read, before it is queued. An answer made from many rows (MaxSim
over long documents, bge-m3's outputs) is made in an answer thread, so the event loop keeps taking
requests meanwhile.

The reader thread keeps the event loop free while a large body is decoded and tokenized (on the
loop, one such body stalled every request of the replica, `/ping` included), and reads one body
at a time, so the memory of decoding is one body's whatever arrives. It does no torch work, so it
starts no OpenMP team (handlers/loops/model_thread.py).
"""

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

from ts_compiled_handlers.configuration.placement import Loop
from ts_compiled_handlers.loops.model_thread import ModelThread, one_thread
from ts_compiled_handlers.loops.token_scheduler import TokenScheduler
from ts_compiled_handlers.request.holding import held_images, held_rows
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.worker.messages import Incoming, Reply
from ts_compiled_handlers.worker.worker import Worker

FULL = "the server is at its queue limit (scheduler.max_queue); retry shortly"
OFF_LOOP_BYTES = 1 << 20  # an answer made from more rows than this is made in the answer thread


class ScheduledRequests:
    """Requests one at a time through a token scheduler over one worker."""

    kind = Loop.SCHEDULED

    def __init__(self, worker: Worker, model_thread: ModelThread):
        self.worker = worker
        self.model_thread = model_thread
        settings = worker.serving.config.scheduler
        budget = worker.engine.plan.full_call_tokens if settings.call_tokens == "auto" else settings.call_tokens
        self.scheduler = TokenScheduler(
            worker.run,
            budget,
            settings.max_queue,
            worker.record_call,
            lambda error: worker.metrics.count("BatchSplits", type(error).__name__, 1),
            model_thread.executor,
            settings.fill_ms / 1000,
        )
        self.reader_thread = ThreadPoolExecutor(1, thread_name_prefix="request-reader")
        self.reading = 0  # requests in the reader thread, held as much as queued ones
        self.held = held_images(worker.task.images_budget or 0)  # an image task's queued images
        self.rows = held_rows(worker.task.config.max_held_bytes)  # per-token tasks' rows, queued to answered
        # answers made from many rows (MaxSim over long documents) leave the event loop free
        self.answer_thread = ThreadPoolExecutor(1, thread_name_prefix="answer", initializer=one_thread)

    @property
    def full(self) -> bool:
        return self.scheduler.held + self.reading >= self.scheduler.max_queue

    def check_room(self) -> None:
        """A 503 for a request that arrives at a full queue, before anything of it is read."""
        if self.full:
            raise RequestError(503, FULL)

    async def serve(self, incoming: Incoming) -> AsyncIterator[Reply]:
        """The request's replies as every one-at-a-time loop yields them: here its one reply."""
        yield await self.reply(incoming)

    async def reply(self, incoming: Incoming) -> Reply:
        """The request's reply, and its spans where the worker traces; never raises."""
        tracer = self.worker.tracer
        if tracer is None:
            return await self.answer(incoming)
        trace = tracer.begin(incoming)
        reply = await self.answer(incoming, trace)
        tracer.finish(trace, reply.status)
        return reply

    async def answer(self, incoming: Incoming, trace=None) -> Reply:
        """The request's reply (`trace`: its RequestTrace, told of each step); never raises."""
        stage = "preprocess"
        try:
            self.check_room()
            accepted = await self.read(incoming, trace)
            if isinstance(accepted, Reply):  # answered without the model
                return accepted
            stage = "inference"
            task = self.worker.task
            rows_held = task.rows_held(accepted) if task.token_values else 0  # pooled tasks: none to count
            holding_rows = self.rows.holding(rows_held, accepted.request.texts_field) if rows_held else nullcontext()
            with self.held.holding(task.images_held(accepted), "images"), holding_rows:
                rows = await self.scheduler.submit(accepted, accepted.work)
                stage = "postprocess"
                if trace is not None:
                    trace.encoding = time.time_ns()
                if rows_held < OFF_LOOP_BYTES:
                    return self.worker.reply(accepted, rows)
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self.answer_thread, self.worker.reply, accepted, rows)
        except Exception as error:  # its own failure (the scheduler isolates a failing call)
            return self.worker.refused(incoming.route, error, stage)

    async def read(self, incoming: Incoming, trace=None) -> Accepted | Reply:
        """The request read, checked and tokenized in the reader thread (`RequestReader.accept`)."""
        self.reading += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.reader_thread, self.worker.reader.accept, incoming, 0, trace)
        finally:
            self.reading -= 1
