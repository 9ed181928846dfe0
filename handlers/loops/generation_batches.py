"""Text generation in request batches (`continuousBatching: false`): a batch's prompts decode together to the end.

The prompts of the accepted requests are grouped by length (up to the largest batch bucket per
group) and each group generates until every prompt in it is finished (handlers/engine/static_decoding.py).
Streaming requests get their new text after every token, through the `send` the server gives
(`send(batch, {index: text})`). A failing group is split as any batch is (`outcome.isolate`),
except that a request that already streamed text cannot start again: it ends with the error.
"""

from typing import Any, Callable

from ts_compiled_handlers.configuration.placement import Loop
from ts_compiled_handlers.engine import buckets, static_decoding
from ts_compiled_handlers.engine.layout import Call
from ts_compiled_handlers.loops.request_batches import Batch, RequestBatches
from ts_compiled_handlers.request.outcome import isolate
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks.continuation import Job

Send = Callable[[Batch, dict[int, str]], None]


class GenerationBatches(RequestBatches):
    """Request batches over a generation worker; `send` carries streamed text to the server."""

    kind = Loop.GENERATION_BATCHES

    def __init__(self, worker, send: Send = lambda batch, chunks: None):
        super().__init__(worker)
        self.send = send

    def inference(self, batch: Batch) -> Batch:
        """Generate for every accepted prompt; a failing group is split until the failing request is alone."""
        task = self.worker.task
        self.worker.follow_worker_count()
        for accepted in batch.accepted:
            batch.replies[accepted.index].content_type = task.content_type(accepted)
        live = batch.live(batch.accepted)
        outcomes = isolate(live, lambda requests: self.generate(batch, requests), self.count_split) if live else []
        for accepted, outcome in zip(live, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self.fail(batch, accepted.index, "inference", outcome)
            elif outcome is not None:
                batch.outputs[accepted.index] = outcome
        self.worker.report_recompiles()
        return batch

    def generate(self, batch: Batch, requests: list[Accepted]) -> list[list[Job] | None]:
        """Each request's finished prompts (None for one that failed in an earlier try)."""
        live = batch.live(requests)
        jobs = [job for accepted in live for job in self.worker.task.jobs(accepted)]
        lengths = [len(job.ids) for job in jobs]
        groups = buckets.generation_groups(lengths, self.worker.engine.plan)
        self.worker.record_traffic(lengths, [Call(group, tuple((i,) for i in group.indices)) for group in groups])
        engine = self.worker.engine
        try:
            for group in groups:
                members = [jobs[i] for i in group.indices]
                decoder = engine.decoder(group, [job.ids for job in members])
                static_decoding.generate(
                    decoder, members, group.batch_size, engine.pad_id, lambda done: self.stream(batch, done)
                )
        except Exception as error:
            for job in jobs:  # a request that already streamed text cannot start again
                if job.continuation.streamed:
                    self.fail(batch, job.accepted.index, "inference", error)
            raise
        served = {id(accepted) for accepted in live}
        return [[job for job in jobs if job.accepted is one] if id(one) in served else None for one in requests]

    def stream(self, batch: Batch, jobs: list[Job]) -> None:
        """Send the new text of streaming prompts, one chunk per request."""
        chunks = {}
        for accepted in {id(job.accepted): job.accepted for job in jobs if job.streams}.values():
            chunk = self.worker.task.chunk_text([job for job in jobs if job.accepted is accepted], False)
            if chunk:
                chunks[accepted.index] = chunk
        if chunks:
            self.send(batch, chunks)

    def respond(self, accepted: Accepted, outputs: Any) -> Any:
        return self.worker.task.final(outputs, self.worker.served)
