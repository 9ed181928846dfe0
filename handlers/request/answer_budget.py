"""Every answer bounded before it is made: the most bytes of JSON one request is answered with.

TorchServe's frontend reads each answer of a worker's reply into a buffer of at most its
`max_response_size` (6.5 MB by default; 32 MiB in our config.properties); a longer one throws
TooLongFrameException and closes the worker's channel, so the worker exits and every request of
its batch fails. Long before that, an answer made of many small Python objects holds many times
its JSON in the worker (a tokenize answer of 325,000 tokens: ~25 MB of JSON, ~320 MB of dicts).
One limit, `handler.max_response_bytes`, bounds each request's answer twice:
- `check`, before the answer is made, where its size follows from the request: its items (tokens,
  values) times the fewest bytes JSON writes one in (in practice, where values vary), so only an
  answer sure to be too large is refused there, before any of it is made;
- `check_text`, on the encoded answer: the last guard, exact, for every task and protocol.
Either refusal is that request's 413, naming the field to change; its batch-mates are answered.
"""

import dataclasses

from ts_compiled_handlers.request.payload import RequestError

# 6 MiB, under TorchServe's own default max_response_size (6,553,500 bytes), so that an archive on a
# stock TorchServe is safe too: 64 texts of a 4096-wide embedding take ~3 MB, 64 tokenized texts
# of 512 tokens ~2 MB, 64 SPLADE texts of ~2,000 terms ~6 MB in TEI's form (~3 MB in ours).
DEFAULT_LIMIT = 6 << 20
OPTION = "handler.max_response_bytes"


@dataclasses.dataclass(frozen=True)
class AnswerBudget:
    """The most bytes of JSON (UTF-8) one request's answer may take."""

    limit: int = DEFAULT_LIMIT

    def check(self, items: int, item_bytes: int, what: str, field: str, remedy: str) -> None:
        """Refuse, before it is made, an answer of `items` `what` of at least `item_bytes` each."""
        if items * item_bytes > self.limit:
            raise self.refusal(f"would hold {items} {what}: over {items * item_bytes} bytes", field, remedy)

    def check_text(self, text: str, field: str, remedy: str | None = None) -> str:
        """The encoded answer itself if it fits (`remedy`: by default, fewer texts in `field`)."""
        size = len(text) if text.isascii() else len(text.encode())
        if size > self.limit:
            raise self.refusal(f"takes {size} bytes", field, remedy or f"send fewer texts in '{field}'")
        return text

    def refusal(self, size: str, field: str, remedy: str) -> RequestError:
        limit = f"more than the {self.limit} bytes one answer may take ({OPTION})"
        return RequestError(413, f"the answer {size}, {limit}; {remedy}", field)
