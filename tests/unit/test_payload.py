import pytest

from ts_compiled_handlers.protocols import RequestSpec, body_value
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.request.payload import RequestError, boolean_param

PARAMS = {"normalize": boolean_param}


def parse_one(body, content_type="application/json", max_inputs=4):
    return PlainProtocol().read(body_value(body, content_type), RequestSpec(PARAMS, max_inputs))


def test_raw_text_json_string_and_list():
    assert parse_one("hello", "text/plain").texts == ["hello"]
    assert parse_one(b"hello", "application/octet-stream").texts == ["hello"]
    single = parse_one({"inputs": "hi", "normalize": False})
    assert (single.texts, single.is_list, single.params) == (["hi"], False, {"normalize": False})
    assert parse_one({"inputs": ["a", "b"]}).is_list
    assert parse_one(b'{"inputs": ["a"]}').texts == ["a"]


@pytest.mark.parametrize(
    "body, code, fragment",
    [
        (b"", 400, "empty request body"),
        (b"\xff\xfe\xfa", 400, "not valid UTF-8"),
        (b'{"inputs": ', 400, "not valid JSON"),
        (42, 400, "object with an 'inputs' key"),
        ({"text": "x"}, 400, "object with an 'inputs' key"),
        ({"inputs": [1, 2]}, 400, "'inputs'[0] is not a string"),
        ({"inputs": [["a"]]}, 400, "'inputs'[0] is not a string"),
        ({"inputs": ""}, 400, "'inputs'[0] is empty"),
        ({"inputs": []}, 400, "empty list"),
        ({"inputs": ["a"] * 5}, 413, "at most 4"),
        ({"inputs": "a", "top_k": 3}, 400, "unknown parameter"),
        ({"inputs": "a", "normalize": "yes"}, 400, "'normalize' must be true or false"),
    ],
)
def test_bad_requests_get_their_own_4xx(body, code, fragment):
    with pytest.raises(RequestError) as error:
        parse_one(body)
    assert error.value.status == code
    assert fragment in error.value.message
    assert error.value.body() == {"error": error.value.message, "code": code}


def test_an_image_body_on_a_text_model_is_refused_as_a_media_type():
    from ts_compiled_handlers.protocols import read_request
    from ts_compiled_handlers.protocols.openai import EmbeddingsProtocol

    protocols = [EmbeddingsProtocol(), PlainProtocol()]
    for route in ("", "v1/embeddings"):
        with pytest.raises(RequestError) as error:
            read_request(b"\x89PNG\r\n\x1a\n", "image/png", route, protocols, RequestSpec(PARAMS, 4))
        assert error.value.status == 415 and "an image body is not read here" in error.value.message


def test_errors_never_echo_the_input():
    secret = "CANARY-7f3a"
    for body in (
        {"inputs": secret, "bogus": 1},
        {"inputs": "x", secret: 1},
        {"inputs": [secret, 3]},
        secret.encode() + b"\xff",
    ):
        with pytest.raises(RequestError) as error:
            parse_one(body)
        assert secret not in error.value.message
