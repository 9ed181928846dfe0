"""What a worker holds for requests read and not yet answered, counted against one limit.

Two things a request brings grow with what it sends, not with the model: its images (decoded,
`images.batch_images`) and the per-token output rows its texts make (bge-m3's three outputs,
ColBERT's vectors, `embed_all`'s states: `handler.max_held_bytes`). The loops count each over a
batch (request batches) or over the queue (the scheduled loop) before the request goes to the
model: a request that could never fit is refused with 413, one that fits once the held ones are
answered with 503, so that no batch or queue holds more than its limit and the worker lives.
"""

import contextlib
import threading

from ts_compiled_handlers.request.payload import RequestError


class Held:
    """`unit`s held against `most`, the limit the config's `option` sets."""

    def __init__(self, most: int, unit: str, option: str):
        self.most, self.unit, self.option = most, unit, option
        self.held = 0
        self.lock = threading.Lock()

    def take(self, count: int, field: str | None) -> None:
        """Hold `count` more, or refuse the request that brings them: a 413 where it could never
        fit, a 503 where it fits once the held ones are answered."""
        if count > self.most:
            message = f"the request would hold {count} {self.unit}; a worker holds at most {self.most} ({self.option})"
            raise RequestError(413, message, field)
        with self.lock:
            if count and self.held + count > self.most:
                held = f"the worker holds {self.held} {self.unit} not yet answered"
                message = f"{held}; {count} more would pass {self.option} ({self.most}): send it again shortly"
                raise RequestError(503, message, field)
            self.held += count

    def give_back(self, count: int) -> None:
        with self.lock:
            self.held -= count

    @contextlib.contextmanager
    def holding(self, count: int, field: str | None):
        """`count` held while the block runs (a queued request's, until it is answered)."""
        self.take(count, field)
        try:
            yield
        finally:
            self.give_back(count)


def held_images(most: int) -> Held:
    return Held(most, "images", "images.batch_images")


def held_rows(most: int) -> Held:
    return Held(most, "bytes of output rows", "handler.max_held_bytes")
