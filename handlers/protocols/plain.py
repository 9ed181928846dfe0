"""This package's own bodies: raw UTF-8 text, or JSON `{"inputs": "text" | ["a", "b"], <task parameters>}`.

A string in gets one answer out; a list gets a list in the same order. Tasks that take text pairs
(cross-encoders) also take `{"text": q, "text_pair": p}` (and lists of them) as `inputs`, as
transformers' pipeline does. Refusals are `{"error": "...", "code": N}`. Text generation's
streamed answers are JSON lines, `{"index", "text"}` per piece and a summary line per prompt
(handlers/servers/torchserve/generation_handler.py).
"""

import json
from typing import Any

from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.request.answers import Generated, fields, written
from ts_compiled_handlers.request.payload import RequestError, check_params, check_texts


class PlainProtocol(Protocol):
    def read(self, value: Any, spec: RequestSpec) -> Request:
        value = spec.adapt(value)
        if isinstance(value, str):
            return Request(check_texts([value], spec.max_inputs), {}, self, is_list=False)
        if not isinstance(value, dict) or "inputs" not in value:
            raise RequestError(400, "JSON body must be an object with an 'inputs' key", "inputs")
        texts, is_list = _texts(value["inputs"], spec.max_inputs, spec.pairs)
        params = check_params({name: param for name, param in value.items() if name != "inputs"}, spec.params)
        return Request(texts, params, self, is_list)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return written(answers if request.is_list else answers[0])

    def stream_pieces(self, request: Request, pieces: list[tuple[int, str]]) -> str:
        return "".join(json.dumps({"index": index, "text": piece}) + "\n" for index, piece in pieces if piece)

    def stream_end(
        self, request: Request, pieces: list[tuple[int, str]], results: list[Generated], prompt_tokens=0
    ) -> str:
        lines = []
        for (index, piece), result in zip(pieces, results, strict=True):
            if piece:
                lines.append({"index": index, "text": piece})
            lines.append({"index": index, **fields(result)})
        return "".join(json.dumps(line) + "\n" for line in lines)


def _texts(inputs: Any, max_inputs: int, pairs: bool) -> tuple[list, bool]:
    if isinstance(inputs, str):
        return check_texts([inputs], max_inputs), False
    if pairs and isinstance(inputs, dict):
        return check_pairs([inputs], max_inputs), False
    if pairs and isinstance(inputs, list) and inputs and all(isinstance(item, dict) for item in inputs):
        return check_pairs(inputs, max_inputs), True
    if isinstance(inputs, list):
        return check_texts(inputs, max_inputs), True
    if pairs:
        raise RequestError(
            400, "'inputs' must be a string, a {'text', 'text_pair'} object, or a list of either", "inputs"
        )
    raise RequestError(400, "'inputs' must be a string or a list of strings", "inputs")


def check_pairs(inputs: list, max_inputs: int) -> list[tuple[str, str]]:
    """A non-empty list of at most `max_inputs` {"text": a, "text_pair": b} objects, as pairs."""
    for position, item in enumerate(inputs):
        if set(item) != {"text", "text_pair"}:
            raise RequestError(
                400, f"'inputs'[{position}] must be an object with exactly 'text' and 'text_pair'", "inputs"
            )
    firsts = check_texts([item["text"] for item in inputs], max_inputs)
    seconds = check_texts([item["text_pair"] for item in inputs], max_inputs)
    return list(zip(firsts, seconds, strict=True))
