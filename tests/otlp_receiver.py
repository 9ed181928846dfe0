"""A real OTLP/HTTP trace endpoint on loopback for the tracing tests: it decodes the protobuf the
exporter sends (opentelemetry-proto's ExportTraceServiceRequest) and keeps every span it got."""

import contextlib
import dataclasses
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanMessage

PATH = "/v1/traces"


@dataclasses.dataclass(frozen=True)
class Span:
    """One received span, its ids as hex and its attributes as plain values."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict
    error: bool


def plain(value):
    """An OTLP AnyValue as the Python value it holds."""
    return getattr(value, value.WhichOneof("value"))


def spans_of(message: ExportTraceServiceRequest) -> list[Span]:
    found = []
    for resource in message.resource_spans:
        service = {item.key: plain(item.value) for item in resource.resource.attributes}.get("service.name")
        for scope in resource.scope_spans:
            for span in scope.spans:
                found.append(
                    Span(
                        service,
                        span.name,
                        SpanMessage.SpanKind.Name(span.kind),
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex(),
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        {item.key: plain(item.value) for item in span.attributes},
                        span.status.code == span.status.STATUS_CODE_ERROR,
                    )
                )
    return found


class Receiver:
    """The spans received so far, and a way to wait for the ones a test expects."""

    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}{PATH}"
        self.spans: list[Span] = []
        self.changed = threading.Condition()

    def add(self, spans: list[Span]) -> None:
        with self.changed:
            self.spans.extend(spans)
            self.changed.notify_all()

    def wait_for(self, check, seconds: float = 30) -> list[Span]:
        """The spans once `check(spans)` holds; AssertionError if it does not within `seconds`."""
        deadline = time.monotonic() + seconds
        with self.changed:
            while not check(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, f"the spans expected did not arrive in {seconds} s; got {len(self.spans)}"
                self.changed.wait(left)
            return list(self.spans)

    def trace(self, trace_id: str, names: set[str], seconds: float = 30) -> list[Span]:
        """The spans of trace `trace_id`, once every name in `names` is among them."""
        spans = self.wait_for(lambda got: names <= {s.name for s in got if s.trace_id == trace_id}, seconds)
        return [span for span in spans if span.trace_id == trace_id]


@contextlib.contextmanager
def receiving():
    """A Receiver listening on a free loopback port, for the block's length."""
    receiver: Receiver | None = None

    class Endpoint(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != PATH:
                self.send_error(404)
                return
            message = ExportTraceServiceRequest()
            message.ParseFromString(body)
            receiver.add(spans_of(message))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):  # quiet: the tests read spans, not access lines
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    receiver = Receiver(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
