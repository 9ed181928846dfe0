"""Cohere's v2 embed API at the model's own path: `POST /predictions/{model}/{version}/v2/embed`,
so `cohere.ClientV2(base_url="http://127.0.0.1:8080/predictions/minilm/1.0", api_key=KEY)` works.

    {"texts": [...], "model", "input_type", "embedding_types": ["float", "int8", ...],
     "truncate": "NONE" | "START" | "END", "output_dimension"}
 -> {"id", "embeddings": {"float": [[...]], "int8": [[...]], ...}, "texts", "meta", "response_type"}

`embedding_types` are the precisions of handlers/tasks/precisions.py (`float` is float32; `base64`
the float32 bytes, little-endian, as Cohere and OpenAI send them). `input_type` picks the model's
prompt of that meaning where it has one (`search_query`: a `query` prompt...), else its default.
`max_tokens` is not served (the archive's length limit holds) and `images` need an image model:
both refused with a 400 naming them, as is an unknown `input_type` or embedding type.
"""

import dataclasses
import uuid
from typing import Any

from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.protocols.openai import OpenAIProtocol, as_base64
from ts_compiled_handlers.request.payload import RequestError, check_params, check_texts

# Cohere's input types, each with the prompt names that mean it, first found first taken
INPUT_TYPES = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "doc"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
TYPES = {"float": "float32", "int8": "int8", "uint8": "uint8", "binary": "binary", "ubinary": "ubinary"}
TRUNCATE = {  # Cohere cuts a long text at its END by default; NONE refuses it
    "NONE": {"truncate": False},
    "START": {"truncate": True, "truncation_direction": "left"},
    "END": {"truncate": True, "truncation_direction": "right"},
}
UNSERVED = ("max_tokens", "images", "inputs")
FIELDS = ("texts", "model", "input_type", "embedding_types", "truncate", "output_dimension", "priority")


@dataclasses.dataclass(frozen=True)
class CohereForm:
    embedding_types: tuple[str, ...]  # as the body named them (`float`, `base64`...)


class CohereEmbedProtocol(Protocol):
    routes = ("v2/embed",)
    texts_field = "texts"

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = {key: item for key, item in OpenAIProtocol.body_object(value, spec).items() if item is not None}
        for name in UNSERVED:
            if name in body:
                raise RequestError(400, f"'{name}' is not served here (see docs/tasks.md#quantized-answers)", name)
        texts = body.get("texts")
        if not isinstance(texts, list):
            raise RequestError(400, "'texts' must be a list of strings", "texts")
        kinds = embedding_types(body.get("embedding_types", ["float"]))
        check = spec.params["precision"]  # the embedding task's (handlers/tasks/embedding.py)
        precisions = tuple(dict.fromkeys(check(TYPES.get(kind, "float32"), "embedding_types") for kind in kinds))
        params = check_params({key: item for key, item in body.items() if key not in FIELDS}, spec.params)
        params.update(truncation(body.get("truncate", "END")), **prompt(body.get("input_type"), spec.prompts))
        if "output_dimension" in body:  # checked as `dimensions`, named as Cohere names it
            params["dimensions"] = spec.params["dimensions"](body["output_dimension"], "output_dimension")
        params["precision"] = precisions  # checked above, one by one
        return Request(check_texts(texts, spec.max_inputs, "texts"), params, self, form=CohereForm(kinds))

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        columns = {
            kind: [answer.embeddings[TYPES.get(kind, "float32")] for answer in answers]
            for kind in request.form.embedding_types
        }
        return embed_answer(request.texts, columns, {"input_tokens": prompt_tokens})

    def error(self, error: RequestError) -> Any:
        return {"message": error.message}


def embed_answer(texts: list[str], columns: dict[str, list], billed: dict) -> dict:
    """Cohere v2's answer: a column of vectors per embedding type (`base64`'s packed from float32's)."""
    columns = {
        kind: [as_base64(row.tolist()) for row in rows] if kind == "base64" else rows for kind, rows in columns.items()
    }
    meta = {"api_version": {"version": "2"}, "billed_units": billed}
    return {
        "id": str(uuid.uuid4()),
        "embeddings": columns,
        "texts": texts,
        "meta": meta,
        "response_type": "embeddings_by_type",
    }


def embedding_types(value: Any) -> tuple[str, ...]:
    known = (*TYPES, "base64")
    if not isinstance(value, list) or not value or not all(isinstance(kind, str) and kind in known for kind in value):
        raise RequestError(400, f"'embedding_types' must be a list of: {', '.join(known)}", "embedding_types")
    return tuple(dict.fromkeys(value))


def truncation(value: Any) -> dict:
    if not isinstance(value, str) or value not in TRUNCATE:  # a list or object is no name (nor hashable)
        raise RequestError(400, f"'truncate' must be one of: {', '.join(TRUNCATE)}", "truncate")
    return TRUNCATE[value]


def prompt(input_type: Any, prompts: dict) -> dict:
    """The model's prompt for Cohere's `input_type` (none named: the model's default prompt)."""
    if input_type is None:
        return {}
    if not isinstance(input_type, str) or input_type not in INPUT_TYPES:
        raise RequestError(400, f"'input_type' must be one of: {', '.join(INPUT_TYPES)}", "input_type")
    name = next((name for name in INPUT_TYPES[input_type] if name in prompts), None)
    return {} if name is None else {"prompt_name": name}
