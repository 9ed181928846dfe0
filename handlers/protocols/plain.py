"""This package's own bodies: raw UTF-8 text, or JSON `{"inputs": "text" | ["a", "b"], <task parameters>}`.

A string in gets one answer out; a list gets a list in the same order. Refusals are
`{"error": "...", "code": N}`. Text generation's streamed answers are JSON lines, `{"index", "text"}`
per piece and a summary line per prompt (handlers/generation.py).
"""

import json
from typing import Any

from handlers.payload import RequestError, check_params, check_texts
from handlers.protocols import Protocol, Request, RequestSpec, Served


class PlainProtocol(Protocol):
    def decode(self, value: Any, spec: RequestSpec) -> Request:
        value = spec.adapt(value)
        if isinstance(value, str):
            return Request(check_texts([value], spec.max_inputs), {}, self, is_list=False)
        if not isinstance(value, dict) or "inputs" not in value:
            raise RequestError(400, "JSON body must be an object with an 'inputs' key")
        texts, is_list = _texts(value["inputs"], spec.max_inputs)
        params = check_params({name: param for name, param in value.items() if name != "inputs"}, spec.params)
        return Request(texts, params, self, is_list)

    def encode(self, request: Request, answers: list, served: Served) -> Any:
        return answers if request.is_list else answers[0]

    def stream_pieces(self, request: Request, pieces: list[tuple[int, str]]) -> str:
        return "".join(json.dumps({"index": index, "text": piece}) + "\n" for index, piece in pieces if piece)

    def stream_end(self, request: Request, pieces: list[tuple[int, str]], results: list[dict]) -> str:
        lines = []
        for (index, piece), result in zip(pieces, results, strict=True):
            if piece:
                lines.append({"index": index, "text": piece})
            lines.append({"index": index, **result})
        return "".join(json.dumps(line) + "\n" for line in lines)


def _texts(inputs: Any, max_inputs: int) -> tuple[list[str], bool]:
    if isinstance(inputs, str):
        return check_texts([inputs], max_inputs), False
    if isinstance(inputs, list):
        return check_texts(inputs, max_inputs), True
    raise RequestError(400, "'inputs' must be a string or a list of strings")
