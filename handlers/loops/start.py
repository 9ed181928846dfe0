"""A worker and its loop, started in one place for every server: the loop chosen once from where
the worker sits (handlers/configuration/placement.py), the worker built in the model thread wherever
requests come one at a time (the thread that calls the model must be the one that built it)."""

from collections.abc import Callable

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.configuration.placement import Loop, Placement, loop_of
from ts_compiled_handlers.loops.decode_loop import DecodeLoop
from ts_compiled_handlers.loops.decode_loop_driver import ContinuousRequests
from ts_compiled_handlers.loops.generation_batches import GenerationBatches
from ts_compiled_handlers.loops.model_thread import ModelThread
from ts_compiled_handlers.loops.request_batches import RequestBatches
from ts_compiled_handlers.loops.scheduled_requests import ScheduledRequests
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.worker.worker import Worker

ServingLoop = RequestBatches | GenerationBatches | ScheduledRequests | DecodeLoop | ContinuousRequests


def start(
    placement: Placement,
    config: HandlerConfig,
    task_class: type[Task],
    sink,
    worker_class: type[Worker] = Worker,
    progress=None,
    send_chunks: Callable | None = None,
) -> tuple[Worker, ServingLoop]:
    """The worker built, warmed and checked, and the loop that serves it. `config`: the
    placement's, parsed once by its server; `send_chunks(batch, chunks)`: how generation in batches
    streams (TorchServe's intermediate responses)."""
    loop = loop_of(task_class.NAME, placement)
    build = (worker_class.build, placement, task_class, sink, progress, config)
    if placement.one_at_a_time:
        model_thread, worker = ModelThread.start(*build)
        if loop is Loop.SCHEDULED:
            return worker, ScheduledRequests(worker, model_thread)
        return worker, ContinuousRequests(DecodeLoop(worker), model_thread)
    worker = build[0](*build[1:])
    if loop is Loop.REQUEST_BATCHES:
        return worker, RequestBatches(worker)
    if loop is Loop.DECODE_LOOP:
        return worker, DecodeLoop(worker)
    return worker, GenerationBatches(worker, send_chunks or (lambda batch, chunks: None))
