"""Scheduling by tokens inside the worker: requests queue as they arrive, each model call takes what waits.

Where a server hands every request to the worker as it arrives and answers each whenever it is
done (TorchServe's `asyncCommunication: true`; handlers/loops/scheduled_requests.py), the scheduler sits between
them, as TEI's router does:
- a request is queued already tokenized, with a future for its outputs;
- when the engine is idle the oldest request starts a call at once (no timer); while a call runs,
  requests arriving queue and the next call takes them, oldest first, as many as fit the call's
  token budget (the oldest always goes, a later one that does not fit waits for the next call);
- under load (requests waited through the call just made) the next call may wait up to
  `fill_seconds` for more, as a request batch waits its delay: until as many more requests as the
  call just made took have come (their clients, answered, are likely to send again) or the budget
  is full; a call that starts an idle engine never waits;
- the call runs in one thread of its own (torch and the tokenizers release the GIL), so the event
  loop parses, tokenizes and encodes answers while the model computes;
- a call that raises runs again on halves of its requests, down to single ones, so only a request
  that fails alone gets the error (`outcome.isolate`, in the call's thread);
- the queue is bounded: `full` tells the caller to answer 503 instead of growing a backlog.
"""

import asyncio
import collections
import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ts_compiled_handlers.request.outcome import isolate

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Waiting:
    """A queued request: what the call function takes, its tokens, when it came, and its future."""

    item: Any
    tokens: int
    arrived: float
    future: asyncio.Future


@dataclasses.dataclass(frozen=True)
class CallReport:
    """What one model call took: its requests, their tokens, and how long each had waited (s)."""

    requests: int
    tokens: int
    waited: list[float]


class TokenScheduler:
    """Runs `call(items) -> outputs` (one per item, in order) over what waits, `call_tokens` at a time.

    `on_call(report)` is told of every call made, once it is done (the metrics); `on_split(error)`
    of every call that raised and was split. Calls run in `executor`'s one thread (the handler's
    model thread, handlers/loops/model_thread.py), else in a thread of the scheduler's own.
    """

    def __init__(
        self,
        call: Callable[[list], list],
        call_tokens: int,
        max_queue: int,
        on_call: Callable[[CallReport], None] = lambda report: None,
        on_split: Callable[[BaseException], None] = lambda error: None,
        executor: ThreadPoolExecutor | None = None,
        fill_seconds: float = 0.0,
    ):
        self.call = call
        self.call_tokens = call_tokens
        self.max_queue = max_queue
        self.on_call = on_call
        self.on_split = on_split
        self.queue: collections.deque[Waiting] = collections.deque()
        self.queued_tokens = 0
        self.fill_seconds = fill_seconds
        self.filled: asyncio.Future | None = None  # set once the queue is filled, while a call waits for it
        self.fill_until = 0  # the queued requests that end a fill
        self.held = 0  # requests queued or in the running call
        self.draining: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop that drains
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix="model-call")

    @property
    def full(self) -> bool:
        return self.held >= self.max_queue

    async def submit(self, item: Any, tokens: int) -> Any:
        """`item`'s outputs, once a call over it is done; its own exception if it fails alone."""
        loop = asyncio.get_running_loop()
        waiting = Waiting(item, tokens, time.perf_counter(), loop.create_future())
        self.queue.append(waiting)
        self.held += 1
        self.queued_tokens += tokens
        filled = len(self.queue) >= self.fill_until or self.queued_tokens >= self.call_tokens
        if self.filled is not None and not self.filled.done() and filled:
            self.filled.set_result(None)
        if self.draining is None:
            self.loop = loop
            self.draining = loop.create_task(self._drain())
        try:
            return await waiting.future
        finally:
            self.held -= 1

    async def _drain(self) -> None:
        """Calls over what waits, until nothing does."""
        taken: list[Waiting] = []
        try:
            while self.queue:
                if taken:
                    await self._fill(len(self.queue) + len(taken))
                taken = self.take()
                now = time.perf_counter()
                tokens = sum(waiting.tokens for waiting in taken)
                made = CallReport(len(taken), tokens, [now - waiting.arrived for waiting in taken])
                await self._run_isolated(taken)
                self.on_call(made)  # after the call, beside the metrics the call itself wrote
        except Exception as error:  # a defect here must not strand a request: fail what it holds, loudly
            logger.exception("The scheduler failed; failing the %d requests it held", len(taken) + len(self.queue))
            for waiting in [*taken, *self.queue]:
                _settle(waiting.future, error=error)
            self.queue.clear()
            self.queued_tokens = 0
        finally:
            self.draining = None

    async def _fill(self, requests: int) -> None:
        """Up to `fill_seconds` for the queue to hold `requests` or the call budget (none where it does)."""
        if not self.fill_seconds or len(self.queue) >= requests or self.queued_tokens >= self.call_tokens:
            return
        self.fill_until = requests
        self.filled = asyncio.get_running_loop().create_future()
        try:  # `asyncio.wait` returns at the timeout (wait_for raises, and a different error before 3.11)
            await asyncio.wait({self.filled}, timeout=self.fill_seconds)
        finally:
            self.filled = None

    def take(self) -> list[Waiting]:
        """The next call's requests: the oldest, then every later one that still fits the budget."""
        taken = [self.queue.popleft()]
        used = taken[0].tokens
        kept: collections.deque[Waiting] = collections.deque()
        while self.queue:
            waiting = self.queue.popleft()
            if used + waiting.tokens <= self.call_tokens:
                taken.append(waiting)
                used += waiting.tokens
            else:
                kept.append(waiting)
        self.queue = kept
        self.queued_tokens -= used
        return taken

    async def _run_isolated(self, taken: list[Waiting]) -> None:
        """One call over `taken`, split in the call's thread if it raises; each future gets its outcome."""
        loop = asyncio.get_running_loop()
        items = [waiting.item for waiting in taken]
        outcomes = await loop.run_in_executor(self.executor, isolate, items, self.call, self._split_on_loop)
        for waiting, outcome in zip(taken, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                _settle(waiting.future, error=outcome)
            else:
                _settle(waiting.future, result=outcome)

    def _split_on_loop(self, error: BaseException) -> None:
        """`on_split`, told from the call's thread, run on the event loop's."""
        self.loop.call_soon_threadsafe(self.on_split, error)


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Set a future's outcome unless it is done already (its awaiting request was cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
