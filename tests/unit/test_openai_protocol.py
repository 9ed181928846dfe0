"""OpenAI bodies decoded and encoded without a model: fields, refusals in OpenAI's shape, SSE framing."""

import base64
import json
import struct

import pytest

from ts_compiled_handlers.protocols import Answered, RequestSpec, Served
from ts_compiled_handlers.protocols.openai import EmbeddingsProtocol, ModelsProtocol
from ts_compiled_handlers.protocols.openai_generation import ChatCompletionsProtocol, CompletionsProtocol
from ts_compiled_handlers.request.answers import Generated, Vector
from ts_compiled_handlers.request.payload import RequestError, boolean_param, int_param, number_param

EMBEDDING = RequestSpec({"normalize": boolean_param, "dimensions": int_param(1, 8)}, 4, model_name="m")
GENERATION = RequestSpec(
    {"max_new_tokens": int_param(1, 32), "top_p": number_param(0, 1), "stream": boolean_param, "seed": int_param(0, 9)},
    4,
    adapt=lambda body: {"inputs": " | ".join(f"{m['role']}: {m['content']}" for m in body["messages"])},
    model_name="m",
)
SERVED = Served("m", "1.0")


def refusal(protocol, body, spec) -> dict:
    with pytest.raises(RequestError) as refused:
        protocol.read(body, spec)
    return {"status": refused.value.status, **protocol.error(refused.value)["error"]}


def test_embedding_inputs_in_every_form():
    protocol = EmbeddingsProtocol()
    assert protocol.read({"input": "a"}, EMBEDDING).texts == ["a"]
    assert protocol.read({"input": ["a", "b"], "model": "m", "user": "u"}, EMBEDDING).texts == ["a", "b"]
    assert protocol.read({"input": [5, 6]}, EMBEDDING).token_ids == [[5, 6]]
    assert protocol.read({"input": [[5], [6, 7]]}, EMBEDDING).token_ids == [[5], [6, 7]]
    assert protocol.read({"input": "a", "dimensions": 4, "normalize": False}, EMBEDDING).params == {
        "dimensions": 4,
        "normalize": False,
    }


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": "a", "model": "other"}, 404, "model"),
        ({"inputs": "a"}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [[1], []]}, 400, "input"),
        ({"input": [1, "a"]}, 400, "input"),
        ({"input": [True]}, 400, "input"),
        ({"input": ["a"] * 5}, 413, "input"),
        ({"input": "a", "encoding_format": "bits"}, 400, "encoding_format"),
        ({"input": "a", "encoding_format": {}}, 400, "encoding_format"),  # empty is no name: not the default
        ({"input": "a", "encoding_format": ["float"]}, 400, "encoding_format"),
        ({"input": "a", "dimensions": 9}, 400, "dimensions"),
        ("text", 400, None),
    ],
)
def test_embedding_refusals_take_openais_shape(body, status, param):
    error = refusal(EmbeddingsProtocol(), body, EMBEDDING)
    assert (error["status"], error["param"]) == (status, param)
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert error["code"] == ("model_not_found" if status == 404 else None) and "other" not in error["message"]


def test_embeddings_are_encoded_as_floats_or_base64_float32():
    protocol = EmbeddingsProtocol()
    answers = [Vector([0.5, -1.25]), Vector([3.0, 0.0])]
    floats = protocol.encode(protocol.read({"input": ["a", "b"]}, EMBEDDING), answers, SERVED, 7)
    assert floats == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5, -1.25]},
            {"object": "embedding", "index": 1, "embedding": [3.0, 0.0]},
        ],
        "model": "m",
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }  # fmt: skip
    packed = protocol.encode(protocol.read({"input": "a", "encoding_format": "base64"}, EMBEDDING), answers[:1], SERVED)
    assert struct.unpack("<2f", base64.b64decode(packed["data"][0]["embedding"])) == (0.5, -1.25)


def test_models_is_answered_without_the_model():
    with pytest.raises(Answered) as answered:
        ModelsProtocol().read(None, EMBEDDING)
    assert answered.value.body["data"][0]["id"] == "m" and not ModelsProtocol.reads_body


def test_completion_fields_become_the_tasks_parameters():
    protocol = CompletionsProtocol()
    request = protocol.read(
        {"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "stop": None, "n": 1},
        GENERATION,
    )
    assert request.texts == ["hi"] and request.params == {"top_p": 0.5, "max_new_tokens": 5, "do_sample": False}
    sampled = protocol.read({"prompt": ["a", "b"], "temperature": 0.7, "seed": 3}, GENERATION)
    assert sampled.params == {"seed": 3, "do_sample": True, "temperature": 0.7} and sampled.texts == ["a", "b"]
    parts = [{"type": "text", "text": "be"}, {"type": "text", "text": " brief"}]
    chat = ChatCompletionsProtocol().read({"messages": [{"role": "developer", "content": parts}]}, GENERATION)
    assert chat.texts == ["system: be brief"] and chat.form.completion_id.startswith("chatcmpl-")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "a", "n": 2}, "n"),
        ({"prompt": "a", "logprobs": 2}, "logprobs"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "temperature": 3}, "temperature"),
        ({"prompt": "a", "max_tokens": 33}, "max_tokens"),
        ({"prompt": "a", "max_tokens": 3, "max_completion_tokens": 3}, "max_tokens"),
        ({"prompt": [1, 2]}, "prompt"),
        ({"prompt": "a", "stream_options": {"include_usage": 1}}, "stream_options"),
        ({"prompt": "a", "tools": [{"type": "function"}]}, "tools"),
    ],
)
def test_unserved_completion_fields_are_refused_by_name(body, param):
    error = refusal(CompletionsProtocol(), body, GENERATION)
    assert (error["status"], error["param"]) == (400, param)


def test_a_chat_stream_is_server_sent_events_with_a_role_first_and_done_last():
    protocol = ChatCompletionsProtocol()
    request = protocol.read(
        {"messages": [{"role": "user", "content": "x"}], "stream": True, "stream_options": {"include_usage": True}},
        GENERATION,
    )
    first = protocol.stream_pieces(request, [(0, "Hel")])
    later = protocol.stream_pieces(request, [(0, "lo")])
    end = protocol.stream_end(request, [(0, "!")], [Generated("Hello!", "stop", 3)], 4)
    events = (first + later + end).split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(event.startswith("data: ") for event in events[:-1])
    chunks = [json.loads(event[6:]) for event in events[:-2]]
    assert [chunk["choices"][0]["delta"] for chunk in chunks[:4]] == [
        {"role": "assistant", "content": "Hel"},
        {"content": "lo"},
        {"content": "!"},
        {},
    ]
    assert chunks[3]["choices"][0]["finish_reason"] == "stop" and chunks[4]["choices"] == []
    assert chunks[4]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
