"""One prompt's generated text as it grows: end conditions, stop strings, and what is safe to stream.

The text is decoded from all generated ids each time (a token may complete a multi-byte character
or merge with its neighbour), and streaming holds back a tail that is an unfinished character or
could still become a stop string, so a client never receives text that is later taken back.
"""

import dataclasses
from typing import Any

from ts_compiled_handlers.engine.sampling import Sampler
from ts_compiled_handlers.request.answers import Generated

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete multi-byte character


class Continuation:
    def __init__(self, tokenizer, max_new_tokens: int, stop: list[str], eos_ids: set[int]):
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.stop = stop
        self.eos_ids = eos_ids
        self.ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None  # "stop" (eos or a stop string) or "length"
        self.streamed = 0  # characters of `text` already sent

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token_id: int) -> None:
        """Take the next generated token unless already finished; eos ends without joining the text."""
        if self.finished:
            return
        if token_id in self.eos_ids:
            self.finish_reason = "stop"
            return
        self.ids.append(token_id)
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = min((self.text.find(s) for s in self.stop if s in self.text), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.finish_reason = "stop"
        elif len(self.ids) >= self.max_new_tokens:
            self.finish_reason = "length"

    def pending(self) -> str:
        """New text safe to send now; marks it sent."""
        end = len(self.text)
        if not self.finished:
            end = self._safe_end()
        piece = self.text[self.streamed : end]
        self.streamed = max(self.streamed, end)
        return piece

    def _safe_end(self) -> int:
        text = self.text.rstrip(REPLACEMENT)
        held = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return len(text) - held


@dataclasses.dataclass
class Job:
    """One prompt of one request (a batch.Accepted), and what it has generated so far."""

    accepted: Any
    position: int  # which text of the request
    ids: list[int]
    continuation: Continuation
    sampler: Sampler

    @property
    def streams(self) -> bool:
        return self.accepted.request.params.get("stream", False)

    def result(self) -> Generated:
        """The prompt's answer once it is finished."""
        return Generated(self.continuation.text, self.continuation.finish_reason, len(self.continuation.ids))
