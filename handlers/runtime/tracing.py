"""OpenTelemetry traces of requests (`handler.tracing`): off by default, and free when off.

A loop times each request's steps as they happen, in plain integers (`RequestTrace`: when the
worker got it, its tokenizing, the model call that took it, its encoding); once the request is
answered, `Tracer.finish` makes its spans from those times, under the caller's W3C `traceparent`
where it sent one:

    hfserve.request      the worker's part of the request (kind SERVER): status, texts, tokens
      hfserve.tokenize   read, checked and tokenized
      hfserve.queue      tokenized, waiting for the model (the token scheduler's queue, or the
                         batch's other requests being read)
      hfserve.model_call the call it shared: its requests, texts and tokens
      hfserve.encode     the answer made and encoded

No span carries a request's text. The SDK's batch processor exports them over OTLP/HTTP from a
thread of its own. Where tracing is off no `Tracer` exists, the loops time nothing, and
OpenTelemetry is never imported (this module imports it only in `Tracer`).
"""

import dataclasses
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

TRACE_HEADERS = ("traceparent", "tracestate")  # W3C Trace Context, as the caller sent them
EXPORT_EVERY_MS = 1000  # spans leave the worker within a second, in one request per second at most
INSTALL = "pip install 'ts-compiled-handlers[tracing]'"


@dataclasses.dataclass(frozen=True)
class CallMark:
    """One model call, as each request it took sees it: when it ran (ns) and what it held."""

    began: int
    ended: int
    requests: int
    texts: int
    tokens: int


@dataclasses.dataclass
class RequestTrace:
    """One request's steps, timed in nanoseconds since the epoch as they happen; None: not reached."""

    carrier: dict[str, str]  # the caller's trace headers
    route: str
    received: int = dataclasses.field(default_factory=time.time_ns)
    tokenized: tuple[int, int] | None = None
    texts: int = 0
    tokens: int = 0
    call: CallMark | None = None
    encoding: int | None = None  # when its answer began to be made

    def read(self, began: int, texts: int, tokens: int) -> None:
        """Its tokenizing, from `began` until now."""
        self.tokenized, self.texts, self.tokens = (began, time.time_ns()), texts, tokens


def mark_call(requests: list, began: int, ended: int) -> None:
    """The model call over `requests` (each with its `trace`), from `began` to `ended`."""
    texts = sum(len(request.token_ids) for request in requests)
    tokens = sum(request.tokens for request in requests)
    mark = CallMark(began, ended, len(requests), texts, tokens)
    for request in requests:
        if request.trace is not None:
            request.trace.call = mark


class Tracer:
    """Makes and exports the spans of one worker's requests (`config`: its `tracing:` section)."""

    def __init__(self, config, model_name: str, task_name: str):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as error:
            raise RuntimeError(f"handler.tracing.endpoint needs OpenTelemetry's SDK and exporter: {INSTALL}") from error
        # A provider of the worker's own, never the process-wide one: a library must not take that.
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        )
        exporter = OTLPSpanExporter(endpoint=config.endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_EVERY_MS))
        self.tracer = self.provider.get_tracer("ts_compiled_handlers")
        self.propagator = TraceContextTextMapPropagator()
        self.server, self.error = SpanKind.SERVER, Status(StatusCode.ERROR)
        self.in_context = set_span_in_context
        self.common = {"hfserve.model": model_name, "hfserve.task": task_name}
        logger.info("Request spans go to %s (OTLP/HTTP, service %s)", config.endpoint, config.service_name)

    def begin(self, incoming) -> RequestTrace:
        """A request's record, from now: the server's `Incoming`, with the caller's trace headers."""
        return RequestTrace(incoming.trace_context or {}, incoming.route)

    def finish(self, trace: RequestTrace, status: int) -> None:
        """The request's spans, from its record, ended now; never raises (a trace is not an answer)."""
        try:
            self.spans(trace, status, time.time_ns())
        except Exception:  # a defect in tracing must not fail the request that it traces
            logger.exception("A request's spans could not be made")

    def spans(self, trace: RequestTrace, status: int, ended: int) -> None:
        attributes: dict[str, Any] = {
            **self.common,
            "hfserve.route": trace.route,
            "http.response.status_code": status,
            "hfserve.texts": trace.texts,
            "hfserve.tokens": trace.tokens,
        }
        parent = self.propagator.extract(trace.carrier)
        request = self.tracer.start_span("hfserve.request", parent, self.server, attributes, start_time=trace.received)
        if status >= 500:  # a server span's 4xx is the caller's error, not this one's
            request.set_status(self.error)
        within = self.child_of(request)
        if trace.tokenized is not None:
            within("hfserve.tokenize", *trace.tokenized, {"hfserve.texts": trace.texts, "hfserve.tokens": trace.tokens})
        call = trace.call
        if call is not None:
            if trace.tokenized is not None:
                within("hfserve.queue", trace.tokenized[1], call.began, {})
            shared = {"hfserve.call.requests": call.requests, "hfserve.call.texts": call.texts}
            within("hfserve.model_call", call.began, call.ended, {**shared, "hfserve.call.tokens": call.tokens})
        if trace.encoding is not None:
            within("hfserve.encode", trace.encoding, ended, {})
        request.end(end_time=ended)

    def child_of(self, span):
        """`within(name, began, ended, attributes)`: a span under `span`, over those times."""
        context = self.in_context(span)

        def within(name: str, began: int, ended: int, attributes: dict) -> None:
            self.tracer.start_span(name, context, attributes=attributes, start_time=began).end(end_time=ended)

        return within

    def shutdown(self) -> None:
        """What is still buffered, exported (the provider also does it at the process's exit)."""
        self.provider.shutdown()


def tracer_for(config, model_name: str, task_name: str) -> Tracer | None:
    """The worker's tracer, or None where `config` (its `tracing:` section) names no endpoint."""
    return Tracer(config, model_name, task_name) if config.endpoint else None
