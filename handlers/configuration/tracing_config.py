"""The `tracing:` section of the handler's configuration: where a worker's OpenTelemetry spans go
(handlers/runtime/tracing.py), off unless an endpoint is named."""

import dataclasses

from ts_compiled_handlers.configuration import config_values as values
from ts_compiled_handlers.configuration.config_values import option as _option


@dataclasses.dataclass(frozen=True)
class TracingConfig:
    endpoint: str | None = _option(
        values.otlp_endpoint,
        None,
        shown="`off`",
        meaning="the OTLP/HTTP URL a worker sends its request spans to (an OpenTelemetry collector's "
        "`http://HOST:4318/v1/traces`): each request's span continues the caller's W3C `traceparent`, with "
        "its queue wait, tokenizing, the model call it shared and encoding as children, never its text; the "
        "exporter's own `OTEL_EXPORTER_OTLP_*` variables (headers, certificate, timeout) apply; needs "
        "`pip install ts-compiled-handlers[tracing]`; `off`: no span made, OpenTelemetry never imported",
        why="traces follow a slow request from the gateway into the worker; off until asked for, since they "
        "cost a span per step of every request and a collector to send them to",
    )
    service_name: str = _option(
        values.service_name,
        "hfserve",
        meaning="the `service.name` of the spans' resource (the model's name is an attribute of each span)",
        why="one name for every archive, so one query finds every worker's spans",
    )
    sample_ratio: float = _option(
        values.share,
        1.0,
        meaning="the share of traces a worker starts itself that it records; a caller's `traceparent` decides "
        "for its own requests (sampled or not, as it says)",
        why="every trace by default: an embedding request makes five spans, few next to its model call",
    )
