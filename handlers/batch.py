"""One TorchServe batch on its way through preprocess, inference and postprocess, one boundary per request.

TorchServe answers every request of a batch with 503 when `handle` raises, so nothing one request
sends may escape its own boundary: `Batch.guard(index, stage)` turns a `RequestError` into that
request's 4xx and anything else into its 500, and the rest of the batch goes on. A batched model
call that raises is run again on halves of its requests, down to single ones
(`split_until_isolated`), so only a request that fails on its own is failed.

Exception messages can quote what a client sent, so failures are logged by type and code location
only, never with their message.
"""

import contextlib
import dataclasses
import json
import logging
import traceback
from typing import Any, Callable

from tokenizers import Encoding

from ts_compiled_handlers.metrics import count
from ts_compiled_handlers.payload import RequestError
from ts_compiled_handlers.protocols import Protocol, Request
from ts_compiled_handlers.tokenizing import Tokenized

logger = logging.getLogger(__name__)

INTERNAL_ERROR = {"error": "internal error while handling this request; the server log has the cause", "code": 500}


@dataclasses.dataclass(frozen=True)
class Accepted:
    """A request that passed its checks: its position in the batch, the decoded request, and its
    texts tokenized (handlers/tokenizing.py)."""

    index: int
    request: Request
    tokenized: Tokenized

    @property
    def token_ids(self) -> list[list[int]]:
        return self.tokenized.token_ids

    @property
    def encodings(self) -> list[Encoding]:
        return self.tokenized.encodings

    @property
    def tokens(self) -> int:
        """The request's tokens, special ones included, after truncation: its usage."""
        return sum(len(ids) for ids in self.tokenized.token_ids)


@dataclasses.dataclass
class Batch:
    """The requests of one `handle` call: answers by position, and what each step made of them."""

    context: Any
    answers: list[Any]  # by position in the batch: an error body, or the answer postprocess made
    accepted: list[Accepted] = dataclasses.field(default_factory=list)
    outputs: dict[int, Any] = dataclasses.field(default_factory=dict)  # by position: what inference made
    failed: set[int] = dataclasses.field(default_factory=set)
    protocols: dict[int, Protocol] = dataclasses.field(default_factory=dict)  # by position: whose error shape

    @classmethod
    def of(cls, size: int, context) -> "Batch":
        return cls(context, [None] * size)

    @contextlib.contextmanager
    def guard(self, index: int, stage: str):
        """Whatever the block raises becomes the answer of request `index` alone."""
        try:
            yield
        except RequestError as error:
            self.refuse(index, error)
        except Exception as error:  # anything at all: one request must not fail the others
            self.fail(index, stage, error)

    def refuse(self, index: int, error: RequestError) -> None:
        self.context.set_response_status(error.code, error.phrase, index)
        self.answers[index] = self._error_body(index, error)
        self.failed.add(index)

    def _error_body(self, index: int, error: RequestError) -> Any:
        protocol = self.protocols.get(index)
        return protocol.error(error) if protocol is not None else error.body()

    def fail(self, index: int, stage: str, error: BaseException) -> None:
        """Request `index` gets a 500; the cause goes to the log without the request's text."""
        if index in self.failed:
            return
        logger.error("Request %d of the batch failed in %s: %s", index, stage, describe(error))
        count(self.context, "RequestFailures", stage, 1)
        self.context.set_response_status(500, "Internal Server Error", index)
        self.answers[index] = self._error_body(index, RequestError(500, INTERNAL_ERROR["error"]))
        self.failed.add(index)

    def as_json(self, answers: list) -> list:
        """Each answer as JSON text, encoded once here (TorchServe would encode it again, indented);
        text and bytes go as they are. An answer JSON cannot carry (NaN) is its request's 500."""
        sent = []
        for index, answer in enumerate(answers):
            if not isinstance(answer, (str, bytes, bytearray)):
                with self.guard(index, "postprocess"):
                    answer = json.dumps(answer, allow_nan=False)
                if not isinstance(answer, str):  # the guard refused it: its error body instead
                    answer = json.dumps(self.answers[index])
                self.context.set_response_content_type(index, "application/json")
            sent.append(answer)
        return sent

    def live(self, requests: list[Accepted]) -> list[Accepted]:
        return [request for request in requests if request.index not in self.failed]


def split_until_isolated(batch: Batch, requests: list[Accepted], run: Callable[[list[Accepted]], None]) -> None:
    """`run(requests)`; if it raises, each half again, so only a request that fails alone is failed."""
    requests = batch.live(requests)
    if not requests:
        return
    try:
        run(requests)
    except Exception as error:  # the model call's errors have no fixed type
        if len(requests) == 1:
            batch.fail(requests[0].index, "inference", error)
            return
        logger.warning("A call over %d requests raised %s; retrying each half", len(requests), type(error).__name__)
        count(batch.context, "BatchSplits", type(error).__name__, 1)
        half = len(requests) // 2
        split_until_isolated(batch, requests[:half], run)
        split_until_isolated(batch, requests[half:], run)


def describe(error: BaseException) -> str:
    """The exception's type, its causes' types and the code locations, but not the messages."""
    causes = []
    cause: BaseException | None = error
    while cause is not None and len(causes) < 8:
        causes.append(type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    frames = traceback.extract_tb(error.__traceback__)[-12:]
    where = "".join(f"\n  {frame.filename}:{frame.lineno} in {frame.name}" for frame in frames)
    return " <- ".join(causes) + " (message withheld: it may quote the request)" + where
