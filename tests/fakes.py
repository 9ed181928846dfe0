"""Stand-ins for TorchServe's parts, for unit tests that drive a handler in process."""

import json

from ts.context import Context

from benchmarks.in_process import make_context, ready_handler, start_batch  # noqa: F401 (shared with the benchmarks)


def status(context: Context, index: int) -> int:
    return context.get_response_status(index)[0] or 200


def decoded(answers: list, context: Context) -> list:
    """`handle`'s answers as a client reads them: JSON bodies parsed, others (JSON lines) as text."""
    return [
        json.loads(answer) if context.get_response_content_type(index) == "application/json" else answer
        for index, answer in enumerate(answers)
    ]


def answered(handler, bodies: list, content_types: list[str] | None = None) -> list:
    """One batch of request bodies through `handle`, as TorchServe calls it; the parsed answers."""
    start_batch(handler.context, content_types or ["application/json"] * len(bodies))
    return decoded(handler.handle([{"body": body} for body in bodies], handler.context), handler.context)


class RecordingSocket:
    """Stands in for the worker's socket to the frontend: keeps what intermediate responses send."""

    def __init__(self):
        self.messages: list[bytes] = []

    def sendall(self, message) -> None:
        self.messages.append(bytes(message))


class RecordingMetrics:
    """Stands in for a context's metrics cache: keeps (name, value, dimensions, metric type) per call."""

    def __init__(self):
        self.calls = []

    def add_metric(self, name, value, unit, dimensions, metric_type):
        self.calls.append((name, value, {d.name: d.value for d in dimensions}, metric_type.name))
