"""OpenAI's API at TorchServe's own paths: `/predictions/{model}/{version}/v1/embeddings` and
`v1/models` (generation's endpoints: handlers/protocols/openai_generation.py).

TorchServe hands the path after the version to the handler (the `url_path` header) and checks
`Authorization: Bearer <inference key>`, which is how the `openai` client sends its API key, so
`OpenAI(base_url="http://127.0.0.1:8080/predictions/minilm/1.0/v1", api_key=KEY)` works against
plain TorchServe. Every refusal takes OpenAI's error shape, `{"error": {"message", "type", "param",
"code"}}`. A body's `model` must be the archive's name (a 404, `model_not_found`, otherwise).
Fields of the task's own (`normalize`, `truncate`, `prompt_name`, ...) are accepted as extras
(the client's `extra_body`); fields that OpenAI defines and that are not served get a 400 naming them.
"""

import base64
import dataclasses
import struct
from typing import Any, Literal

from ts_compiled_handlers.protocols import Answered, Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.request.payload import RequestError, check_params, check_texts

ERROR_TYPES = {404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}
ENCODINGS = ("float", "base64")
EMBEDDING_FIELDS = ("input", "model", "encoding_format", "user")


class OpenAIProtocol(Protocol):
    """What every OpenAI endpoint shares: the error shape and the model check."""

    def accepts(self, value: Any) -> bool:
        return True

    def error(self, error: RequestError) -> Any:
        kind = ERROR_TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
        return {"error": {"message": error.message, "type": kind, "param": error.field, "code": error.code}}

    @staticmethod
    def body_object(value: Any, spec: RequestSpec) -> dict:
        """The body as a JSON object whose `model`, if named, is the archive's; `ARCHIVE:ADAPTER`
        names one of its LoRA adapters (as its `adapter` parameter, checked with the others)."""
        if not isinstance(value, dict):
            raise RequestError(400, "the body must be a JSON object")
        model = value.get("model")
        if isinstance(model, str) and model.startswith(spec.model_name + ":") and "adapter" not in value:
            return {**value, "adapter": model.removeprefix(spec.model_name + ":")}  # ARCHIVE:ADAPTER
        if model is not None and model != spec.model_name:
            message = f"'model' names a model not served here; this endpoint serves {spec.model_name}"
            raise RequestError(404, message, "model", "model_not_found")
        return value


def refuse_unserved(value: dict, allowed_values: dict[str, tuple]) -> None:
    """A 400 for an OpenAI field whose value asks for what is not served (tools, logprobs...)."""
    for name, allowed in allowed_values.items():
        if name in value and value[name] not in allowed:
            raise RequestError(400, f"'{name}' is not served with this value (see docs/openai.md)", name)


@dataclasses.dataclass(frozen=True)
class EmbeddingsForm:
    encoding_format: Literal["float", "base64"]


class EmbeddingsProtocol(OpenAIProtocol):
    """`POST v1/embeddings`: `input` is a string, a list of strings, token ids (a list of integers),
    or a list of token-id lists; `encoding_format` float or base64 (float32 little-endian, as OpenAI)."""

    routes = ("v1/embeddings",)
    texts_field = "input"

    def read(self, value: Any, spec: RequestSpec) -> Request:
        value = self.body_object(value, spec)
        if "input" not in value:
            raise RequestError(400, "'input' is required: a string, a list of strings, or token ids", "input")
        encoding = value.get("encoding_format")
        encoding = "float" if encoding is None else encoding  # only null means the default: {} or 0 is no name
        if not isinstance(encoding, str) or encoding not in ENCODINGS:
            raise RequestError(400, f"'encoding_format' must be one of {', '.join(ENCODINGS)}", "encoding_format")
        params = check_params({key: item for key, item in value.items() if key not in EMBEDDING_FIELDS}, spec.params)
        form = EmbeddingsForm(encoding)
        inputs = value["input"]
        if isinstance(inputs, str):
            return Request(check_texts([inputs], spec.max_inputs, "input"), params, self, form=form)
        token_ids = token_id_lists(inputs, spec.max_inputs)
        if token_ids is not None:
            if "prompt_name" in params:
                raise RequestError(
                    400, "'prompt_name' needs text input: token ids are the model's input as sent", "prompt_name"
                )
            return Request([""] * len(token_ids), params, self, token_ids=token_ids, form=form)
        if not isinstance(inputs, list):
            raise RequestError(400, "'input' must be a string, a list of strings, or token ids", "input")
        return Request(check_texts(inputs, spec.max_inputs, "input"), params, self, form=form)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        packed = request.form.encoding_format == "base64"
        vectors = [as_base64(answer.embedding) if packed else answer.embedding for answer in answers]
        data = [{"object": "embedding", "index": index, "embedding": vector} for index, vector in enumerate(vectors)]
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        return {"object": "list", "data": data, "model": served.model_name, "usage": usage}


def token_id_lists(inputs: Any, max_inputs: int) -> list[list[int]] | None:
    """`inputs` as lists of token ids (one list, or a list of lists), or None if it holds no ids."""
    if not isinstance(inputs, list) or not inputs:
        return None
    if all(isinstance(item, list) for item in inputs):
        lists = inputs
    elif all(isinstance(item, int) and not isinstance(item, bool) for item in inputs):
        lists = [inputs]
    else:
        return None
    if len(lists) > max_inputs:
        raise RequestError(413, f"'input' has {len(lists)} token lists; at most {max_inputs} per request", "input")
    for position, ids in enumerate(lists):
        if not ids or not all(isinstance(item, int) and not isinstance(item, bool) for item in ids):
            raise RequestError(400, f"'input'[{position}] must be a non-empty list of token ids (integers)", "input")
    return lists


def as_base64(values: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


class ModelsProtocol(OpenAIProtocol):
    """`GET v1/models`: the one model this endpoint serves, answered without the model."""

    routes = ("v1/models",)
    reads_body = False

    def read(self, value: Any, spec: RequestSpec) -> Request:
        model = {"id": spec.model_name, "object": "model", "created": 0, "owned_by": "torchserve"}
        raise Answered({"object": "list", "data": [model]})
