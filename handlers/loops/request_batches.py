"""The request-batch loop: a server hands over a batch of requests, and gets one reply per request, in order.

Three steps, each overridable (TorchServe's handler shape, handlers/servers/torchserve/adapter.py):
- preprocess: per request, the worker reads and tokenizes it (`RequestReader.accept`); a batch's
  images are counted against the task's budget (`images.batch_images`), a request past it a 503;
- inference: the worker runs the accepted requests in one call, a failing call split until only
  the culprit fails (`Worker.run_each`);
- postprocess: per request, the worker's answer (Python values; `replies` encodes them once).
Every step runs each request inside its own boundary (`Batch.guard`): what one request provokes
is its own reply (its protocol's error body, its status), never the other requests'.
"""

import contextlib
import dataclasses
import time
from typing import Any

from ts_compiled_handlers.configuration.placement import Loop
from ts_compiled_handlers.request.holding import held_images, held_rows
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.worker.messages import USAGE_HEADER, Incoming, Reply
from ts_compiled_handlers.worker.worker import Worker


@dataclasses.dataclass
class Batch:
    """The requests of one call: what each step made of them, by position."""

    incoming: list[Incoming]
    replies: list[Reply]
    accepted: list[Accepted] = dataclasses.field(default_factory=list)
    outputs: dict[int, Any] = dataclasses.field(default_factory=dict)  # by position: what inference made
    failed: set[int] = dataclasses.field(default_factory=set)
    traces: dict = dataclasses.field(default_factory=dict)  # by position, where the worker traces

    @classmethod
    def of(cls, incoming: list[Incoming], tracer=None) -> "Batch":
        traces = {index: tracer.begin(request) for index, request in enumerate(incoming)} if tracer else {}
        return cls(list(incoming), [Reply() for _ in incoming], traces=traces)

    @property
    def answers(self) -> list[Any]:
        return [reply.body for reply in self.replies]

    def live(self, requests: list[Accepted]) -> list[Accepted]:
        return [request for request in requests if request.index not in self.failed]


class RequestBatches:
    """The loop of request batches over one worker."""

    kind = Loop.REQUEST_BATCHES

    def __init__(self, worker: Worker):
        self.worker = worker

    @contextlib.contextmanager
    def guard(self, batch: Batch, index: int, stage: str):
        """Whatever the block raises becomes the reply of request `index` alone."""
        try:
            yield
        except Exception as error:  # anything at all: one request must not fail the others
            self.fail(batch, index, stage, error)

    def fail(self, batch: Batch, index: int, stage: str, error: BaseException) -> None:
        """Request `index` gets the error (a bug: 500, logged without the request's text)."""
        if index in batch.failed:
            return
        batch.replies[index] = self.worker.refused(batch.incoming[index].route, error, stage)
        batch.failed.add(index)

    def fail_all(self, incoming: list[Incoming], error: BaseException) -> list[Reply]:
        """A defect past every per-request boundary: still a reply for everyone."""
        batch = Batch.of(incoming)
        for index in range(len(incoming)):
            self.fail(batch, index, "handle", error)
        return self.replies(batch, batch.answers)

    # -- the steps ----------------------------------------------------------------------------
    def preprocess(self, incoming: list[Incoming]) -> Batch:
        """Read, check and tokenize each request in its own boundary."""
        batch = Batch.of(incoming, self.worker.tracer)
        task = self.worker.task
        held = held_images(task.images_budget) if task.images_budget is not None else None
        rows = held_rows(task.config.max_held_bytes) if task.token_values else None  # the batch's per-token rows
        for index, request in enumerate(incoming):
            with self.guard(batch, index, "preprocess"):
                accepted = self.worker.reader.accept(request, index, batch.traces.get(index))
                if isinstance(accepted, Reply):  # answered without the model
                    batch.replies[index] = accepted
                    continue
                if held is not None:  # the batch's images within the budget, or this one's 503
                    held.take(task.images_held(accepted), "images")
                if rows is not None:
                    rows.take(task.rows_held(accepted), accepted.request.texts_field)
                batch.accepted.append(accepted)
        return batch

    def inference(self, batch: Batch) -> Batch:
        """The accepted requests' texts through the engine; a failing call split until it is isolated."""
        live = batch.live(batch.accepted)
        outcomes = self.worker.run_each(live, self.count_split) if live else []
        for accepted, outcome in zip(live, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self.fail(batch, accepted.index, "inference", outcome)
            else:
                batch.outputs[accepted.index] = outcome
        return batch

    def postprocess(self, batch: Batch) -> list[Any]:
        """Each served request's answer, in its protocol's form."""
        for accepted in batch.live(batch.accepted):
            if accepted.trace is not None:
                accepted.trace.encoding = time.time_ns()
            with self.guard(batch, accepted.index, "postprocess"):
                batch.replies[accepted.index].body = self.respond(accepted, batch.outputs[accepted.index])
                batch.replies[accepted.index].headers[USAGE_HEADER] = str(accepted.tokens)
        return batch.answers

    def respond(self, accepted: Accepted, outputs: Any) -> Any:
        return self.worker.respond(accepted, outputs)

    def replies(self, batch: Batch, answers: list[Any]) -> list[Reply]:
        """The replies to send: each answer as JSON text, encoded once (text and bytes go as they
        are). An answer JSON cannot carry (NaN) is its request's 500; one past the answer budget its 413."""
        protocols = {accepted.index: accepted.request.protocol for accepted in batch.accepted}
        for index, answer in enumerate(answers):
            reply = batch.replies[index]
            if isinstance(answer, (str, bytes, bytearray)) or index in batch.failed:
                reply.body = answer
                continue
            protocol = protocols.get(index) or self.worker.protocol_of(batch.incoming[index].route)
            try:
                reply.body, reply.content_type = self.worker.encoded(answer, protocol), "application/json"
            except (TypeError, ValueError, RequestError) as error:  # a value JSON cannot carry (NaN), or too much
                self.fail(batch, index, "postprocess", error)
        for index, trace in batch.traces.items():  # answered: the spans of the traced requests
            self.worker.tracer.finish(trace, batch.replies[index].status)
        return batch.replies

    def count_split(self, error: BaseException) -> None:
        self.worker.metrics.count("BatchSplits", type(error).__name__, 1)

    def serve_batch(self, incoming: list[Incoming]) -> list[Reply]:
        """One batch, every step; never raises."""
        try:
            batch = self.inference(self.preprocess(incoming))
            return self.replies(batch, self.postprocess(batch))
        except Exception as error:  # a defect past every per-request boundary
            return self.fail_all(incoming, error)
