"""Continuous batching for text generation: requests join and leave a running decode loop.

With `continuousBatching: true` in model-config.yaml, TorchServe calls `handle` again and again with
the requests it holds, up to `batchSize`: new ones with their bodies, running ones resent without a
body (each named by its request id; the TorchServe adapter hands them over as `(id, Incoming)`, a
resent one as `(id, None)`). Each call here admits waiting prompts into free slots of a
`SlotCache` (an eager prefill each), runs up to `generation.steps_per_call` compiled decode steps
over all slots (ending the call early after a step in which a prompt finished, so that it is
answered at once and a new request can take its slot), and answers every request of the call: a
chunk of streamed text, nothing yet, or its final answer.

What TorchServe's frontend does with the answers (its ContinuousBatching and RestJob classes):
- a request leaves only with an answer whose `ts_stream_next` header is `false`; an answer without
  the header keeps it, so every answer here says whether it is the last (`Reply.last`, which the
  adapter turns into the header);
- a request's HTTP status and headers go out with its first answer, and only if that answer says
  `true` or has no header at all: so every first answer says `true`, and a request complete at once
  (a prompt done in its first step) is closed by an empty answer on the next call. A refusal (4xx,
  5xx) is the exception: the frontend closes the connection after an error status, which would cut
  a stream short, so a refusal is one plain answer without the header (and so is an answer made
  without the model, a `v1/models` listing, with status 200);
- a request whose client went away is dropped silently: it stops coming, and its slots are freed on
  the next call. A request past `generation.max_request_seconds` ends with finish_reason "time".

A request's life is a `Phase`, moved only by `DecodeLoop._move`:

    RUNNING --every prompt done, or an error after its first answer--> FINISHED
    RUNNING --an error before its first answer----------------------> REFUSED
    FINISHED --last body sent as a later answer ("false")----------------------> ENDED
    FINISHED --last body sent as its first answer ("true")--> CLOSING --""--> ENDED
    REFUSED --one plain answer (its status, no header)------> CLOSING --""--> ENDED
    any phase --its client left (the frontend stopped sending it)--> ENDED

What the loop needs of the worker is `accept`, `error_body` and its generation task (the prompts,
the streamed and final text: handlers/tasks/generation.py); of the engine, `prefill` and `decode`
(handlers/engine/decoder.py).
"""

import dataclasses
import enum
import logging
import time

import torch

from ts_compiled_handlers.configuration.placement import Loop
from ts_compiled_handlers.request.outcome import describe, internal_error
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.runtime.json_text import as_json
from ts_compiled_handlers.tasks.continuation import Job
from ts_compiled_handlers.worker.messages import Incoming, Reply
from ts_compiled_handlers.worker.worker import Worker

logger = logging.getLogger(__name__)

LOST = {"error": "this request's state was lost (the worker restarted); send it again", "code": 500}


class Phase(enum.Enum):
    RUNNING = "running"  # prompts decoding or waiting for a slot; answers are streamed chunks (or "")
    FINISHED = "finished"  # done, or ended by an error: its next answer is its last body
    REFUSED = "refused"  # an error before its first answer: one plain answer with the status
    CLOSING = "closing"  # its last body went out with its first answer: an empty answer ends it
    ENDED = "ended"  # gone from the loop


MOVES = {
    Phase.RUNNING: {Phase.FINISHED, Phase.REFUSED, Phase.ENDED},
    Phase.FINISHED: {Phase.CLOSING, Phase.ENDED},
    Phase.REFUSED: {Phase.CLOSING, Phase.ENDED},
    Phase.CLOSING: {Phase.ENDED},
    Phase.ENDED: set(),
}


@dataclasses.dataclass
class Running:
    """One request in the loop: its prompts (`jobs`), those still waiting for a slot, its phase,
    and whether its first answer went out. `error`: the body of a request ended by an error."""

    jobs: list[Job]
    waiting: list[Job]
    deadline: float
    phase: Phase = Phase.RUNNING
    opened: bool = False
    error: str | None = None
    status: int = 200  # a refusal's, sent with its answer
    content_type: str = "application/json"

    @property
    def done(self) -> bool:
        return all(job.continuation.finished for job in self.jobs)


class DecodeLoop:
    """The slots, the requests holding them, and one `call` per call of the server."""

    kind = Loop.DECODE_LOOP

    def __init__(self, worker: Worker):
        self.worker = worker
        self.engine = engine = worker.engine
        self.task = worker.task
        limits = worker.serving.config.generation
        self.steps_per_call = limits.steps_per_call
        self.max_seconds = limits.max_request_seconds
        slots = engine.plan.max_batch
        self.running: dict[str, Running] = {}
        self.holders: list[tuple[Job, Running] | None] = [None] * slots  # which prompt holds each slot
        self.tokens = torch.full((slots,), engine.pad_id, dtype=torch.long)  # each slot's next input
        self.positions = torch.zeros(slots, dtype=torch.long)  # where each slot writes it

    @property
    def free_slots(self) -> int:
        return self.holders.count(None)

    @property
    def idle(self) -> bool:
        return self.free_slots == len(self.holders)

    def call(self, requests: list[tuple[str, Incoming | None]]) -> list[Reply]:
        """Replies for one call, in order: `(request id, its request, or None where resent)` in."""
        if self.idle:  # re-tracing the grid writes the slot cache
            self.worker.follow_worker_count()
        ids = [request_id for request_id, _ in requests]
        self._forget_absent(set(ids))
        for index, (request_id, incoming) in enumerate(requests):
            if request_id not in self.running:
                self.running[request_id] = self._arrive(incoming, index)
        try:
            self._admit()
            for _ in range(self.steps_per_call):
                if self.idle or self._step():
                    break  # nothing to run, or a prompt finished: answer it now, and let a new one in
        except Exception as error:  # a defect in the model call: every running request ends with it
            logger.error("The decode loop failed; ending its %d requests: %s", len(self.running), describe(error))
            for running in self.running.values():
                if running.phase is Phase.RUNNING and not running.done:
                    self._end_with_error(running, internal_error())
        replies = [self._answer_alone(request_id) for request_id in ids]
        self.worker.report_recompiles()
        return replies

    def _answer_alone(self, request_id: str) -> Reply:
        """`_answer`; where making it fails (a defect: its final text, its protocol's shape), a 500
        for that request alone, which ends it: its last answer, or a plain one before its first (as
        a refusal's, closed when the frontend sends the request once more)."""
        running = self.running[request_id]
        opened = running.opened  # before `_answer` marks it
        try:
            return self._answer(request_id)
        except Exception as error:
            reply = self.worker.refused("", error, "postprocess")  # counted and logged, a plain 500
            if opened:
                self._end(request_id)
                return dataclasses.replace(reply, last=True)
            if running.phase is Phase.RUNNING:
                self._move(running, Phase.FINISHED)  # its slots freed
            self._move(running, Phase.CLOSING)
            return reply

    # -- requests in and out ---------------------------------------------------------------
    def _move(self, running: Running, phase: Phase) -> None:
        """The one place a request changes phase (see the module docstring)."""
        if phase not in MOVES[running.phase]:
            raise RuntimeError(f"a request cannot go from {running.phase.value} to {phase.value}")
        running.phase = phase
        if phase in (Phase.FINISHED, Phase.REFUSED, Phase.ENDED):
            self._release_slots_of(running)
            running.waiting.clear()

    def _arrive(self, incoming: Incoming | None, index: int) -> Running:
        deadline = time.monotonic() + self.max_seconds
        if incoming is None:  # resent without its headers and parameters (the server holds them), unknown here
            return Running([], [], deadline, Phase.FINISHED, opened=True, error=as_json(LOST))
        try:
            accepted = self.worker.reader.accept(incoming, index)
        except Exception as error:  # anything a body can provoke is this request's alone
            refused = self.worker.refused(incoming.route, error, "preprocess")
            return Running([], [], deadline, Phase.REFUSED, error=refused.body, status=refused.status)
        if isinstance(accepted, Reply):  # answered without the model: one plain answer, as a refusal is
            return Running([], [], deadline, Phase.REFUSED, error=accepted.body)
        jobs = self.task.jobs(accepted)
        return Running(jobs, list(jobs), deadline, content_type=self.task.content_type(accepted))

    def _end_with_error(self, running: Running, error: RequestError) -> None:
        """`running` ends with the error's body, in its protocol's shape: a plain refusal before its
        first answer, its last body after."""
        request = running.jobs[0].accepted.request
        running.error = as_json(request.protocol.error(error))
        running.status = error.status
        self._move(running, Phase.FINISHED if running.opened else Phase.REFUSED)

    def _forget_absent(self, present: set[str]) -> None:
        """Requests the frontend stopped sending (their clients left): free their slots."""
        for request_id in [rid for rid in self.running if rid not in present]:
            gone = self.running.pop(request_id)
            if gone.phase is Phase.RUNNING and not gone.done:
                logger.info("A request left before its end (client gone); its slots are free")
            self._move(gone, Phase.ENDED)

    def _answer(self, request_id: str) -> Reply:
        """What to send now; `last`: whether it is the request's last answer (None: a plain answer)."""
        running = self.running[request_id]
        if running.phase is Phase.RUNNING and running.done:
            self._move(running, Phase.FINISHED)
        if running.phase is Phase.CLOSING:
            self._end(request_id)
            return Reply("", content_type=running.content_type, last=True)
        if running.phase is Phase.REFUSED:  # one plain error answer: should it come again, it closes
            running.opened = True
            self._move(running, Phase.CLOSING)
            return Reply(running.error, running.status, "application/json", last=None)
        first, running.opened = not running.opened, True
        if running.phase is Phase.RUNNING:  # the first answer must say "true", or no status line is sent
            return Reply(self.task.chunk_text(running.jobs), content_type=running.content_type, last=False)
        body = running.error if running.error is not None else self._final_text(running.jobs)
        if first:
            self._move(running, Phase.CLOSING)
            return Reply(body, content_type=running.content_type, last=False)
        self._end(request_id)
        return Reply(body, content_type=running.content_type, last=True)

    def _final_text(self, jobs: list[Job]) -> str:
        final = self.task.final(jobs, self.worker.served)
        return as_json(final)

    def _end(self, request_id: str) -> None:
        self._move(self.running.pop(request_id), Phase.ENDED)

    # -- slots -------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Waiting prompts, oldest request first, into free slots: prefill, then the first token."""
        for running in self.running.values():
            while running.waiting and None in self.holders:
                job = running.waiting.pop(0)
                slot = self.holders.index(None)
                try:
                    logits = self.engine.prefill(job.ids, slot)
                except Exception as error:  # a prefill writes its own slot only: its request alone fails
                    logger.error("A prompt's prefill failed; its request ends: %s", describe(error))
                    self._end_with_error(running, internal_error())
                    break
                self._take(job, slot, job.sampler.choose(logits.float().cpu()))
                if not job.continuation.finished:
                    self.holders[slot] = (job, running)
                    self.positions[slot] = len(job.ids)

    def _step(self) -> bool:
        """One compiled step over every slot, then each held slot's next token; whether one finished."""
        logits = self.engine.decode(self.tokens, self.positions).float().cpu()
        held = [slot for slot, holder in enumerate(self.holders) if holder is not None]
        self.positions[held] += 1
        greedy = logits.argmax(dim=-1).tolist()  # one call for every greedy slot
        now, finished = time.monotonic(), False
        for slot in held:
            job, running = self.holders[slot]
            token = job.sampler.choose(logits[slot]) if job.sampler.do_sample else greedy[slot]
            self._take(job, slot, token)
            if not job.continuation.finished and now > running.deadline:
                job.continuation.finish_reason = "time"
            if job.continuation.finished:
                self._release([slot])
                finished = True
        return finished

    def _release_slots_of(self, running: Running) -> None:
        self._release([slot for slot, held in enumerate(self.holders) if held and held[1] is running])

    def _take(self, job: Job, slot: int, token: int) -> None:
        job.continuation.add(token)
        self.tokens[slot] = token

    def _release(self, slots: list[int]) -> None:
        for slot in slots:
            self.holders[slot] = None
            self.positions[slot] = 0
            self.tokens[slot] = self.engine.pad_id
