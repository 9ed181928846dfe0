"""Continuous batching for text generation: requests join and leave a running decode loop.

With `continuousBatching: true` in model-config.yaml, TorchServe calls `handle` again and again with
the requests it holds, up to `batchSize`: new ones with their bodies, running ones resent without a
body (`context.request_ids` names them). Each call here admits waiting prompts into free slots of a
`SlotCache` (an eager prefill each), runs up to `generation.steps_per_call` compiled decode steps
over all slots (ending the call early after a step in which a prompt finished, so that it is
answered at once and a new request can take its slot), and answers every request of the call: a
chunk of streamed text, nothing yet, or its final answer.

What TorchServe's frontend does with the answers (its ContinuousBatching and RestJob classes):
- a request leaves only with an answer whose `ts_stream_next` header is `false`; an answer without
  the header keeps it, so every answer here sets the header (through `context.stopping_criteria`,
  which TorchServe's response encoder consults);
- a request's HTTP status and headers go out with its first answer, and only if that answer says
  `true` or has no header at all: so every first answer says `true`, and a request complete at once
  (a prompt done in its first step) is closed by an empty answer on the next call. A refusal (4xx,
  5xx) is the exception: the frontend closes the connection after an error status, which would cut
  a stream short, so a refusal is one plain answer without the header;
- a request whose client went away is dropped silently: it stops coming, and its slots are freed on
  the next call. A request past `generation.max_request_seconds` ends with finish_reason "time".
"""

import dataclasses
import json
import logging
import time

import torch

from handlers.batch import INTERNAL_ERROR, Accepted, describe
from handlers.continuation import Job
from handlers.payload import RequestError

logger = logging.getLogger(__name__)

LOST = {"error": "this request's state was lost (the worker restarted); send it again", "code": 500}


@dataclasses.dataclass
class Running:
    """One request in the loop: its prompts (`jobs`), those still waiting for a slot, and whether its
    first answer went out. `refusal` is the whole answer of a request that never ran."""

    jobs: list[Job]
    waiting: list[Job]
    deadline: float
    streams: bool = False
    refusal: str | None = None
    status: tuple[int, str] | None = None  # a refusal's, set with its answer
    opened: bool = False
    closing: bool = False

    @property
    def complete(self) -> bool:
        return self.refusal is not None or all(job.continuation.finished for job in self.jobs)


class DecodeLoop:
    """The slots, the requests holding them, and one `call` per TorchServe handle call."""

    def __init__(self, handler, slots: int, steps_per_call: int, max_seconds: float):
        self.handler = handler
        self.steps_per_call = steps_per_call
        self.max_seconds = max_seconds
        self.running: dict[str, Running] = {}
        self.holders: list[tuple[Job, Running] | None] = [None] * slots  # which prompt holds each slot
        self.tokens = torch.full((slots,), handler.pad_id, dtype=torch.long)  # each slot's next input
        self.positions = torch.zeros(slots, dtype=torch.long)  # where each slot writes it

    @property
    def free_slots(self) -> int:
        return self.holders.count(None)

    @property
    def idle(self) -> bool:
        return self.free_slots == len(self.holders)

    def call(self, data: list[dict], context) -> list[str]:
        """Answers for one call, in order; sets each one's `ts_stream_next` via stopping_criteria."""
        ids = [context.request_ids[index] for index in range(len(data))]
        self._forget_absent(set(ids))
        for index, (request, request_id) in enumerate(zip(data, ids, strict=True)):
            if request_id not in self.running:
                self.running[request_id] = self._arrive(request, index, context)
        try:
            self._admit()
            for _ in range(self.steps_per_call):
                if self.idle or self._step():
                    break  # nothing to run, or a prompt finished: answer it now, and let a new one in
        except Exception as error:  # a defect in the model call: every running request ends with it
            logger.error("The decode loop failed; ending its %d requests: %s", len(self.running), describe(error))
            self._fail_all()
        answers, last = [], []
        for index, request_id in enumerate(ids):
            answer, done = self._answer(request_id, index, context)
            answers.append(answer)
            last.append(done)
        context.stopping_criteria = [lambda _, done=done: done for done in last]
        return answers

    # -- requests in and out ---------------------------------------------------------------
    def _arrive(self, request: dict, index: int, context) -> Running:
        deadline = time.monotonic() + self.max_seconds
        if not request and not context.request_processor[index].get_request_properties():
            # resent without its headers and parameters (TorchServe holds them), but unknown here
            return Running([], [], deadline, refusal=json.dumps(LOST), opened=True)
        try:
            body = self.handler.parse_request(request, index)
            accepted = Accepted(index, body, self.handler.tokenize(body.texts))
            jobs = [self.handler._job(accepted, n, encoding.ids) for n, encoding in enumerate(accepted.encodings)]
        except RequestError as error:
            return Running([], [], deadline, refusal=json.dumps(error.body()), status=(error.code, error.phrase))
        except Exception as error:  # anything else a body can provoke is this request's 500 alone
            logger.error("Request %d of the call failed in preprocess: %s", index, describe(error))
            return Running([], [], deadline, refusal=json.dumps(INTERNAL_ERROR), status=(500, "Internal Server Error"))
        streams = body.params.get("stream", False)
        context.set_response_content_type(index, "application/jsonl" if streams else "application/json")
        return Running(jobs, list(jobs), deadline, streams)

    def _forget_absent(self, present: set[str]) -> None:
        """Requests the frontend stopped sending (their clients left): free their slots."""
        for request_id in [rid for rid in self.running if rid not in present]:
            gone = self.running.pop(request_id)
            self._release_slots_of(gone)
            if not gone.complete:
                logger.info("A request left before its end (client gone); its slots are free")

    def _answer(self, request_id: str, index: int, context) -> tuple[str, bool | None]:
        """(what to send now, whether it is the request's last answer; None: no header, a plain answer)."""
        running = self.running[request_id]
        if running.closing:
            self._end(request_id)
            return "", True
        if running.status is not None and not running.opened:  # a refusal: one plain error answer
            context.set_response_status(*running.status, index)
            context.set_response_content_type(index, "application/json")
            running.opened = running.closing = True  # should the frontend send it again: close it then
            return running.refusal, None
        complete = running.complete
        body = self._final(running) if complete else self._chunk(running)
        if not running.opened:  # the first answer must say "true", or no status line is sent
            running.opened, running.closing = True, complete
            return body, False
        if complete:
            self._end(request_id)
        return body, complete

    def _end(self, request_id: str) -> None:
        ended = self.running.pop(request_id)
        self._release_slots_of(ended)

    def _chunk(self, running: Running) -> str:
        if not running.streams:
            return ""
        pieces = [(job.position, job.continuation.pending()) for job in running.jobs]
        return "".join(json.dumps({"index": n, "text": piece}) + "\n" for n, piece in pieces if piece)

    def _final(self, running: Running) -> str:
        if running.refusal is not None:
            return running.refusal
        return self.handler.final_text(running.jobs[0].request, running.jobs)

    def _fail_all(self) -> None:
        for running in self.running.values():
            if not running.complete:
                self._end_with_error(running)

    def _end_with_error(self, running: Running) -> None:
        """`running` ends with a 500 body (and status, if its first answer has not gone out)."""
        self._release_slots_of(running)
        running.waiting.clear()
        running.refusal = json.dumps(INTERNAL_ERROR)
        running.status = (500, "Internal Server Error")

    # -- slots -------------------------------------------------------------------------------
    def _admit(self) -> None:
        """Waiting prompts, oldest request first, into free slots: prefill, then the first token."""
        for running in self.running.values():
            while running.waiting and None in self.holders:
                job = running.waiting.pop(0)
                slot = self.holders.index(None)
                try:
                    logits = self.handler.prefill(job.ids, slot)
                except Exception as error:  # a prefill writes its own slot only: its request alone fails
                    logger.error("A prompt's prefill failed; its request ends: %s", describe(error))
                    self._end_with_error(running)
                    break
                self._take(job, slot, job.sampler.choose(logits.float().cpu()))
                if not job.continuation.finished:
                    self.holders[slot] = (job, running)
                    self.positions[slot] = len(job.ids)

    def _step(self) -> bool:
        """One compiled step over every slot, then each held slot's next token; whether one finished."""
        logits = self.handler.decode(self.tokens, self.positions).float().cpu()
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
            self.tokens[slot] = self.handler.pad_id
