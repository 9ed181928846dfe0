"""The scheduled loop: each request answered as soon as the model call that took it is done.

Where a server hands requests over one at a time, as they arrive, on an event loop (TorchServe's
`asyncCommunication: true`, a Ray Serve replica), a request is read and tokenized on the loop,
queued in the token scheduler (handlers/loops/token_scheduler.py), and answered once its call is done; model
work runs in the worker's one model thread (handlers/loops/model_thread.py). A queue at
`scheduler.max_queue` answers 503 at once.
"""

from ts_compiled_handlers.loops.model_thread import ModelThread
from ts_compiled_handlers.loops.token_scheduler import CallReport, TokenScheduler
from ts_compiled_handlers.protocols import Answered
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.runtime.json_text import as_json
from ts_compiled_handlers.runtime.metrics import MetricsSink
from ts_compiled_handlers.worker.worker import Incoming, Reply, Worker

FULL = "the server is at its queue limit (scheduler.max_queue); retry shortly"


class ScheduledRequests:
    """Requests one at a time through a token scheduler over one worker."""

    def __init__(self, worker: Worker, model_thread: ModelThread):
        self.worker = worker
        self.model_thread = model_thread
        settings = worker.serving.config.scheduler
        budget = worker.engine.plan.full_call_tokens if settings.call_tokens == "auto" else settings.call_tokens
        metrics = worker.metrics
        self.scheduler = TokenScheduler(
            worker.run,
            budget,
            settings.max_queue,
            lambda made: report(metrics, made),
            lambda error: metrics.count("BatchSplits", type(error).__name__, 1),
            model_thread.executor,
        )

    async def serve(self, incoming: Incoming) -> Reply:
        """The request's reply; never raises."""
        stage = "preprocess"
        try:
            accepted = self.worker.accept(incoming)
            stage = "inference"
            if self.scheduler.full:
                raise RequestError(503, FULL)
            rows = await self.scheduler.submit(accepted, accepted.tokens)
            stage = "postprocess"
            return self.worker.reply(accepted, rows)
        except Answered as answered:  # answered without the model
            return Reply(as_json(answered.body))
        except Exception as error:  # its own failure (the scheduler isolates a failing call)
            return self.worker.refused(incoming.route, error, stage)


def report(metrics: MetricsSink, made: CallReport) -> None:
    """A call's histograms, in units that fit Prometheus' default buckets (0.005 to 10)."""
    metrics.observe("CallKilotokens", made.tokens / 1000, "Kilotokens")
    for seconds in made.waited:
        metrics.observe("SchedulerQueueTime", round(seconds, 6), "Seconds")
