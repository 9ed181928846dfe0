"""What a server hands the worker (`Incoming`) and what it sends back (`Reply`): the two shapes
every loop and server share, and nothing else."""

import dataclasses
from typing import Any

# Every answer's token count (the request's texts after truncation, special tokens included), as
# TEI reports it; bodies keep their shape (the OpenAI and rerank bodies carry it as `usage` too).
USAGE_HEADER = "x-prompt-tokens"


@dataclasses.dataclass(frozen=True)
class Incoming:
    """One request as a server hands it over: its body (bytes, or text or JSON the server already
    read; None for a body-less GET), its content type, its route: the path after
    /predictions/{model}[/{version}], without slashes at its ends; and, where the worker traces, the
    caller's W3C trace headers (`traceparent`, `tracestate`; handlers/runtime/tracing.py)."""

    body: Any
    content_type: str | None = None
    route: str = ""
    trace_context: dict[str, str] | None = None


@dataclasses.dataclass
class Reply:
    """What one request gets back, for the server to send: its body (bytes or text, or a value a
    loop encodes), status, content type and headers. `last`, for loops that answer a request more
    than once: whether this is its last reply (None: a plain reply, sent once)."""

    body: Any = None
    status: int = 200
    content_type: str = "application/json"
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    last: bool | None = None
