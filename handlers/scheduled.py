"""The scheduled loop: each request answered as soon as the model call that took it is done.

Where a server hands requests over one at a time, as they arrive, on an event loop (TorchServe's
`asyncCommunication: true`, a Ray Serve replica), a request is read and tokenized on the loop,
queued in the token scheduler (handlers/scheduler.py), and answered once its call is done; model
work runs in the worker's one model thread (handlers/model_thread.py). A queue at
`scheduler.max_queue` answers 503 at once.
"""

import logging

from ts_compiled_handlers.metrics import MetricsSink
from ts_compiled_handlers.model_thread import ModelThread
from ts_compiled_handlers.payload import RequestError
from ts_compiled_handlers.request_batches import Reply, RequestBatches
from ts_compiled_handlers.scheduler import CallReport, TokenScheduler
from ts_compiled_handlers.tokenizing import Accepted
from ts_compiled_handlers.worker import Incoming, Worker

logger = logging.getLogger(__name__)

FULL = "the server is at its queue limit (scheduler.max_queue); retry shortly"


class ScheduledRequests:
    """Requests one at a time through a token scheduler over one worker."""

    def __init__(self, worker: Worker, model_thread: ModelThread):
        self.worker = worker
        self.model_thread = model_thread
        self.batches = RequestBatches(worker)  # how a reply is encoded, and a request failed
        settings = worker.serving.config.scheduler
        budget = worker.engine.plan.full_call_tokens if settings.call_tokens == "auto" else settings.call_tokens
        metrics = worker.metrics
        self.scheduler = TokenScheduler(
            self.call,
            budget,
            settings.max_queue,
            lambda made: report(metrics, made),
            self.batches.count_split,
            model_thread.executor,
        )

    def call(self, requests: list[Accepted]) -> list:
        """One model call (in the model's thread: a re-trace never overlaps a call)."""
        self.worker.follow_worker_count()
        rows = self.worker.run(requests)
        self.worker.report_recompiles()
        return rows

    async def serve(self, incoming: Incoming) -> Reply:
        """The request's reply; never raises."""
        batch = self.batches.preprocess([incoming])
        if batch.accepted:
            (accepted,) = batch.accepted
            try:
                if self.scheduler.full:
                    raise RequestError(503, FULL)
                batch.outputs[0] = await self.scheduler.submit(accepted, accepted.tokens)
            except Exception as error:  # its own failure, isolated by the scheduler
                self.batches.fail(batch, 0, "inference", error)
        try:
            (reply,) = self.batches.replies(batch, self.batches.postprocess(batch))
        except Exception as error:  # a defect past every per-request boundary
            (reply,) = self.batches.fail_all([incoming], error)
        return reply


def report(metrics: MetricsSink, made: CallReport) -> None:
    """A call's histograms, in units that fit Prometheus' default buckets (0.005 to 10)."""
    metrics.observe("CallKilotokens", made.tokens / 1000, "Kilotokens")
    for seconds in made.waited:
        metrics.observe("SchedulerQueueTime", round(seconds, 6), "Seconds")
