"""KServe v2 (Open Inference Protocol) requests and answers, recognised per request.

TorchServe routes `POST /v2/models/{name}/infer` to the model like `/predictions/{name}`. Its own
`kservev2` envelope is set for the whole server and answers only the first request of a batch,
so the handlers read and write the v2 JSON themselves, request by request, in the same batches
as every other request:

    {"id": "1", "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}],
     "parameters": {<the task's request parameters>}}
 -> {"model_name": ..., "model_version": ..., "id": "1",
     "outputs": [{"name": "embedding", "shape": [2, 384], "datatype": "FP32", "data": [...]}]}

Answers become one output tensor per field (`embedding`; `label` and `score`; `generated_text`
...), rows in input order; answers with no fixed shape (token classification's entity lists) are
one BYTES tensor `output` of JSON strings.
"""

import dataclasses
import json
import math
from typing import Any

import numpy as np

from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.request.answers import TENSORS, fields
from ts_compiled_handlers.request.payload import ParamCheck, RequestError, check_params, check_texts, is_unicode_text
from ts_compiled_handlers.runtime.json_text import plain

REQUEST_KEYS = {"id", "inputs", "parameters", "outputs"}
TENSOR_KEYS = {"name", "shape", "datatype", "data", "parameters"}
NUMPY_TYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int8): "INT8", np.dtype(np.uint8): "UINT8"}


def is_v2(value: Any) -> bool:
    """A v2 inference request: `inputs` is a list of tensor objects, not of texts or text pairs."""
    inputs = value.get("inputs") if isinstance(value, dict) else None
    if not (isinstance(inputs, list) and inputs and all(isinstance(tensor, dict) for tensor in inputs)):
        return False
    return not any({"text", "text_pair"} & set(tensor) for tensor in inputs)


@dataclasses.dataclass(frozen=True)
class V2Form:
    request_id: str  # echoed back ("" for none)


class KServeV2Protocol(Protocol):
    """KServe v2 bodies, told apart from the plain ones by their `inputs` of tensor objects."""

    def accepts(self, value: Any) -> bool:
        return is_v2(value)

    def read(self, value: Any, spec: RequestSpec) -> Request:
        texts, params, request_id = parse(value, spec.params, spec.max_inputs)
        return Request(texts, params, self, form=V2Form(request_id))

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return response(answers, served.model_name, served.model_version, request.form.request_id)


def parse(value: dict, param_checks: dict[str, ParamCheck], max_inputs: int) -> tuple[list[str], dict, str]:
    """The texts of a v2 request's one BYTES input, its task parameters and its id ("" for none)."""
    unknown = set(value) - REQUEST_KEYS
    if unknown:
        raise RequestError(400, f"v2 request has unknown keys; allowed: {', '.join(sorted(REQUEST_KEYS))}")
    if len(value["inputs"]) != 1:
        raise RequestError(400, "v2 request must have exactly one input tensor: the texts, datatype BYTES")
    tensor = value["inputs"][0]
    if set(tensor) - TENSOR_KEYS or tensor.get("datatype") != "BYTES" or not isinstance(tensor.get("data"), list):
        raise RequestError(400, "v2 input must be {name, shape, datatype: BYTES, data: [texts]}")
    shape = tensor.get("shape")
    if not (isinstance(shape, list) and len(shape) <= 8 and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise RequestError(400, "v2 input shape must be a list of at most 8 sizes")
    if any(n > max_inputs for n in shape):  # before multiplying: huge integers cost time to multiply
        raise RequestError(413, f"v2 input shape {shape} is too large: at most {max_inputs} texts per request")
    if math.prod(shape) != len(tensor["data"]):
        raise RequestError(400, f"v2 input shape {shape} does not match its {len(tensor['data'])} data items", "data")
    params = value.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(400, "v2 'parameters' must be an object", "parameters")
    if params.get("stream"):
        raise RequestError(400, "streaming is not part of the v2 protocol; use /predictions with stream: true")
    request_id = value.get("id")
    if request_id is not None and not (isinstance(request_id, str) and is_unicode_text(request_id)):
        raise RequestError(400, "v2 'id' must be a string of Unicode text (it is echoed back)", "id")
    texts = check_texts(tensor["data"], max_inputs)
    return texts, check_params(params, param_checks), request_id or ""


def response(answers: list, model_name: str, model_version: str | None, request_id: str) -> dict:
    """The v2 answer to one request from the task's per-text answers."""
    body = {"model_name": model_name, "model_version": model_version, "outputs": outputs(answers)}
    return {**body, "id": request_id} if request_id else body


def outputs(answers: list) -> list[dict]:
    """One tensor per field where every text's answer is one kind of `TENSORS`, or a list of one
    length of such answers (top-k labels); else one BYTES tensor of JSON strings."""
    kinds = {type(answer) for answer in answers}
    if len(kinds) == 1 and kinds <= set(TENSORS):
        return [tensor(name, [getattr(answer, name) for answer in answers]) for name in names(answers)]
    if answers and all(isinstance(answer, list) and answer for answer in answers):
        items = [item for answer in answers for item in answer]
        kinds = {type(item) for item in items}
        if len(kinds) == 1 and kinds <= set(TENSORS) and len({len(answer) for answer in answers}) == 1:
            return [
                tensor(name, [[getattr(item, name) for item in answer] for answer in answers]) for name in names(items)
            ]
    return [json_tensor("output", answers)]


def names(answers: list) -> list[str]:
    """The fields the answers hold (an m3 answer holds the outputs its request asked for)."""
    return [name for name in fields(answers[0]) if all(getattr(answer, name) is not None for answer in answers)]


def tensor(name: str, rows: list) -> dict:
    """A v2 tensor of `rows` (nested lists of one scalar type and a regular shape), else JSON strings;
    numpy rows (embeddings) keep their type's name (int8 and uint8 answers: INT8, UINT8)."""
    kinds = {NUMPY_TYPES.get(row.dtype) if isinstance(row, np.ndarray) else None for row in rows}
    rows = [plain(row) if isinstance(row, np.ndarray) else row for row in rows]  # embeddings' numpy rows
    shape, leaves = _shape(rows), list(_leaves(rows))
    datatype = kinds.pop() if len(kinds) == 1 and None not in kinds else _datatype(leaves)
    if shape is None or datatype is None:
        return json_tensor(name, rows)
    return {"name": name, "shape": shape, "datatype": datatype, "data": leaves}


def json_tensor(name: str, rows: list) -> dict:
    return {
        "name": name,
        "shape": [len(rows)],
        "datatype": "BYTES",
        "data": [json.dumps(row, default=plain) for row in rows],
    }


def _shape(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return [] if isinstance(value, (bool, int, float, str)) else None
    inner = [_shape(item) for item in value]
    if any(shape is None or shape != inner[0] for shape in inner):
        return None
    return [len(value), *(inner[0] if inner else [])]


def _leaves(value: Any):
    if isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _datatype(leaves: list) -> str | None:
    kinds = {type(leaf) for leaf in leaves}
    if kinds == {str}:
        return "BYTES"
    if kinds == {bool}:
        return "BOOL"
    if kinds == {int}:
        return "INT64"
    if kinds and kinds <= {int, float}:
        return "FP32"
    return None
