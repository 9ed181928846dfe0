"""Request spans through a real TorchServe: the traced archive's worker sends them to the run's OTLP
endpoint (tests/otlp_receiver.py), each request's trace continuing the caller's `traceparent`."""

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.integration

STEPS = {"hfserve.request", "hfserve.tokenize", "hfserve.queue", "hfserve.model_call", "hfserve.encode"}


def test_each_request_continues_its_callers_trace_with_a_span_per_step(task_server, span_receiver):
    trace_ids = [f"{index:x}" * 32 for index in range(1, 5)]
    bodies = [{"inputs": ["alice walks to paris", "the cat sat"]}, {"inputs": "hello"}, b"{broken", {"inputs": "x"}]

    def send(trace_id, body):
        caller = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01", "tracestate": "gateway=1"}
        return task_server.predict("traced-embedder", body, headers=caller)

    with ThreadPoolExecutor(len(bodies)) as pool:  # together, so that calls are shared
        responses = list(pool.map(send, trace_ids, bodies))
    assert [response.status_code for response in responses] == [200, 200, 400, 200]
    for trace_id, response in zip(trace_ids, responses, strict=True):
        expected = STEPS if response.status_code == 200 else {"hfserve.request"}
        spans = {span.name: span for span in span_receiver.trace(trace_id, expected)}
        request = spans["hfserve.request"]
        assert request.parent_id == "00f067aa0ba902b7" and request.kind == "SPAN_KIND_SERVER"
        assert request.attributes["hfserve.model"] == "traced-embedder"
        assert request.attributes["http.response.status_code"] == response.status_code
        if response.status_code == 200:
            assert (
                set(spans) == STEPS and int(response.headers["x-prompt-tokens"]) == request.attributes["hfserve.tokens"]
            )
            assert spans["hfserve.model_call"].attributes["hfserve.call.requests"] >= 1
            assert all(span.parent_id == request.span_id for name, span in spans.items() if name != "hfserve.request")
        else:
            assert set(spans) == {"hfserve.request"}  # refused before the model
