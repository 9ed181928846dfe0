"""Request spans over OTLP/HTTP (`handler.tracing`, handlers/runtime/tracing.py): received by a real
endpoint that decodes the exporter's protobuf, each request's trace continuing the caller's, and
nothing of OpenTelemetry imported where tracing is off."""

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from fakes import decoded, make_context, ready_handler
from otlp_receiver import receiving
from ts.context import RequestProcessor

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.configuration.config_values import ConfigError
from ts_compiled_handlers.servers.torchserve.handler import Handler
from ts_compiled_handlers.worker.messages import Incoming

EAGER = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}, "compile": {"enable": False}}
STEPS = {"hfserve.request", "hfserve.tokenize", "hfserve.queue", "hfserve.model_call", "hfserve.encode"}
TEXTS = ["alice walks to paris", "the cat sat on the mat"]


def traceparent(trace_id: str, parent_id: str = "00f067aa0ba902b7", sampled: bool = True) -> str:
    return f"00-{trace_id}-{parent_id}-{'01' if sampled else '00'}"


def test_the_section_is_off_by_default_and_checked():
    assert parse({}).tracing.endpoint is None and parse({}).tracing.sample_ratio == 1.0
    config = parse({"handler": {"tracing": {"endpoint": "http://collector:4318/v1/traces", "sample_ratio": 0.25}}})
    assert config.tracing.endpoint == "http://collector:4318/v1/traces" and config.tracing.sample_ratio == 0.25
    assert parse({"handler": {"tracing": {"endpoint": "off"}}}).tracing.endpoint is None
    for bad in ({"endpoint": "collector:4318"}, {"endpoint": "ftp://host/x"}, {"endpoint": "http://u:p@host/"}):
        with pytest.raises(ConfigError, match="tracing.endpoint"):
            parse({"handler": {"tracing": bad}})
    with pytest.raises(ConfigError, match="tracing.sample_ratio"):
        parse({"handler": {"tracing": {"sample_ratio": 0}}})
    with pytest.raises(ConfigError, match="tracing.services"):
        parse({"handler": {"tracing": {"services": "x"}}})


def batch_of(handler, bodies: list, headers: list[dict]) -> list:
    """One batch through `handle`, each request with its own HTTP headers, as TorchServe hands them on."""
    context = handler.context
    context.request_processor = [
        RequestProcessor({"body": {"content-type": "application/json"}, **extra}) for extra in headers
    ]
    answers = handler.handle([{"body": body} for body in bodies], context)
    return [
        (context.get_response_status(index)[0] or 200, answer) for index, answer in enumerate(decoded(answers, context))
    ]


def test_request_batches_continue_each_callers_trace_with_a_span_per_step(tiny_models):
    with receiving() as receiver:
        handler = ready_handler("embedding", tiny_models["embedding"], tracing={"endpoint": receiver.url}, **EAGER)
        first, second, refused = "4bf92f3577b34da6a3ce929d0e0e4736", "5bf92f3577b34da6a3ce929d0e0e4737", "6" * 32
        replies = batch_of(
            handler,
            [{"inputs": TEXTS}, {"inputs": TEXTS[0]}, b"{not json", {"inputs": TEXTS[1]}],
            [
                {"traceparent": traceparent(first), "tracestate": "vendor=1"},
                {"traceparent": traceparent(second)},
                {"traceparent": traceparent(refused)},
                {},  # no caller's trace: the worker starts one (sample_ratio 1)
            ],
        )
        assert [status for status, _ in replies] == [200, 200, 400, 200]
        spans = receiver.trace(first, STEPS)
        by_name = {span.name: span for span in spans}
        assert len(spans) == len(STEPS)  # one of each, no more
        request = by_name["hfserve.request"]
        assert request.parent_id == "00f067aa0ba902b7" and request.kind == "SPAN_KIND_SERVER" and not request.error
        assert request.service == "hfserve"
        assert request.attributes["hfserve.model"] == "test" and request.attributes["hfserve.task"] == "embedding"
        assert request.attributes["hfserve.texts"] == 2 and request.attributes["http.response.status_code"] == 200
        assert all(by_name[name].parent_id == request.span_id for name in STEPS - {"hfserve.request"})
        call = by_name["hfserve.model_call"].attributes
        assert call["hfserve.call.requests"] == 3 and call["hfserve.call.texts"] == 4  # the call all three shared
        tokenized, queued = by_name["hfserve.tokenize"], by_name["hfserve.queue"]
        assert request.start <= tokenized.start <= tokenized.end == queued.start <= queued.end
        assert queued.end == by_name["hfserve.model_call"].start <= by_name["hfserve.encode"].start <= request.end
        assert by_name["hfserve.tokenize"].attributes["hfserve.tokens"] == request.attributes["hfserve.tokens"] > 0
        # The second request shares the call's span times, in a trace of its own.
        assert receiver.trace(second, STEPS)[0].trace_id == second
        # The refused one: its request span says 400, and it never reached the model.
        rejected = receiver.trace(refused, {"hfserve.request"})
        assert [span.name for span in rejected] == ["hfserve.request"]
        assert rejected[0].attributes["http.response.status_code"] == 400 and not rejected[0].error
        # The request without a caller's trace got a trace of its own: four traces in all.
        spans = receiver.wait_for(lambda got: len({span.trace_id for span in got}) == 4)
        texts = json.dumps([span.attributes for span in spans])
        assert not any(word in texts for word in ("alice", "paris", "cat", "mat"))  # never a request's text
        handler.worker.tracer.shutdown()


def test_a_caller_that_did_not_sample_its_trace_gets_no_spans(tiny_models):
    with receiving() as receiver:
        handler = ready_handler("embedding", tiny_models["embedding"], tracing={"endpoint": receiver.url}, **EAGER)
        skipped, kept = "7" * 32, "8" * 32
        replies = batch_of(
            handler,
            [{"inputs": TEXTS[0]}, {"inputs": TEXTS[1]}],
            [{"traceparent": traceparent(skipped, sampled=False)}, {"traceparent": traceparent(kept)}],
        )
        assert [status for status, _ in replies] == [200, 200]
        receiver.trace(kept, STEPS)
        handler.worker.tracer.shutdown()  # everything made is exported by now
        assert not [span for span in receiver.spans if span.trace_id == skipped]


def test_the_token_scheduler_traces_its_queue_and_the_call_each_request_joined(tiny_models):
    threads = torch.get_num_threads()
    with receiving() as receiver:
        handler = Handler()
        config = {"dtype": "float32", "task": "embedding", **EAGER, "tracing": {"endpoint": receiver.url}}
        handler.initialize(
            make_context(tiny_models["embedding"], {"asyncCommunication": True, "handler": config}, batch_size=1)
        )
        torch.set_num_threads(threads)  # this test's thread is not an event loop's: give it back
        ids = [f"{index:032x}" for index in range(1, 5)]

        async def send_all():
            async def one(trace_id: str):
                incoming = Incoming(
                    json.dumps({"inputs": TEXTS[0]}), "application/json", "", {"traceparent": traceparent(trace_id)}
                )
                return [reply async for reply in handler.loop.serve(incoming)][-1]

            return await asyncio.gather(*(one(trace_id) for trace_id in ids))

        replies = asyncio.run(send_all())
        assert [reply.status for reply in replies] == [200] * 4
        calls = []
        for trace_id in ids:
            spans = {span.name: span for span in receiver.trace(trace_id, STEPS)}
            queued, call = spans["hfserve.queue"], spans["hfserve.model_call"]
            assert spans["hfserve.tokenize"].end == queued.start <= queued.end == call.start
            calls.append(call.attributes["hfserve.call.requests"])
        assert sum(calls) >= 4 and max(calls) <= 4  # each request in one call; calls shared where they came together
        handler.worker.tracer.shutdown()
        handler.loop.model_thread.executor.shutdown()


def test_with_tracing_off_nothing_of_opentelemetry_is_imported(tiny_models):
    """A served worker, tracing off, in a process of its own: no exporter, SDK or API module loaded."""
    script = textwrap.dedent(
        f"""
        import sys
        from ts_compiled_handlers.benchmarks.in_process import ready_handler, start_batch
        handler = ready_handler("embedding", {str(tiny_models["embedding"])!r}, **{EAGER!r})
        start_batch(handler.context, ["application/json"])
        handler.context.request_processor[0]._request_header["traceparent"] = "00-{"9" * 32}-00f067aa0ba902b7-01"
        answer = handler.handle([{{"body": {{"inputs": "hello"}}}}], handler.context)
        assert handler.worker.tracer is None and answer[0].startswith('{{"embedding"')
        loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
        print("LOADED", loaded)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout
