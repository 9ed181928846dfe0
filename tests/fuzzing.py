"""Seeded hostile request bodies for each task, and TorchServe's own decoding of a request's body.

`hostile_cases(task, seed, count)` yields `Case`s: random bytes, random and mutated JSON, random
Unicode (lone surrogates, control characters, NUL, bidi marks) as JSON and as text, random content
types, deep nesting, unreadable numbers, KServe v2 envelopes, each task's parameters with random
values, and TEI tokenize bodies whose answer would pass the answer budget (a 25 MB answer once
made TorchServe drop the worker). The same seed gives the same cases.
"""

import dataclasses
import json
import random
import struct

CONTENT_TYPES = [
    "application/json",
    "text/plain",
    "application/octet-stream",
    "application/json; charset=utf-16",
    "text/html; charset=latin-1",
    "application/x-www-form-urlencoded",
    "image/png",
    "",
]
# Each task's request parameters, with values a client could plausibly get wrong.
PARAMS = {
    "embedding": ["normalize", "prompt_name"],
    "text-classification": ["top_k"],
    "token-classification": ["aggregation_strategy"],
    "text-generation": ["max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "seed", "stop", "stream"],
    "sparse-embedding": ["top_k", "threshold", "prompt_name"],
    "multi-vector": ["input_type", "prompt_name", "precision"],
    "m3-embedding": ["return_dense", "return_sparse", "return_colbert_vecs", "weights"],
}
GOOD_VALUES = {
    "input_type": ["query", "document"],
    "precision": ["float32"],
    "normalize": [True, False],
    "top_k": [None, 1, 2, 5],
    "aggregation_strategy": ["none", "simple", "first", "average", "max"],
    "max_new_tokens": [1, 3, 8],
    "do_sample": [True, False],
    "temperature": [1e-300, 1e-30, 0.01, 0.7, 1.0, 100.0],
    "top_p": [1e-9, 0.1, 0.9, 1.0],
    "seed": [0, 1, 2**63 - 1],
    "stop": [".", ["a", "\u2028"], "\U0001f600"],
    "stream": [False, True],
    "threshold": [0, 0.05, 2.5],
    "prompt_name": ["query", "document"],
    "return_dense": [True, False],
    "return_sparse": [True, False],
    "return_colbert_vecs": [True, False],
    "weights": [[1, 1, 1], [0.4, 0.2, 0.4], [0, 1, 0]],
}
ODD_VALUES = [
    None, True, 0, -1, 1, 2**63, 10**30, -(10**30), 1e-300, -0.0, 1e308, float("nan"), float("inf"),
    "", "x", "\ud800", [], [1], {}, {"a": 1}, ["\udfff"], "\x00",
]  # fmt: skip
ALPHABET = (
    [chr(c) for c in range(0x20, 0x7F)]
    + [chr(c) for c in range(0x00, 0x20)]
    + ["\x7f", "\u0085", "\u00a0", "\u200b", "\u200d", "\u202e", "\u2028", "\ufeff", "\ufffd", "\uffff"]
    + ["\u0301", "\u0928", "\u4e2d", "\U0001f600", "\U0010ffff", "\ud800", "\udfff", "\udbff\udfff", "é", "ß"]
)


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str
    body: bytes
    content_type: str
    v2: bool = False  # sent to /v2/models/<name>/infer instead of /predictions/<name>
    route: str = ""  # sent to /predictions/<name>/1.0/<route> (OpenAI's paths)

    def __str__(self) -> str:
        where = ", v2" if self.v2 else (f", {self.route}" if self.route else "")
        return f"{self.kind} ({self.content_type or 'no content type'}{where}): {self.body[:300]!r}"


def random_text(rng: random.Random, longest: int = 40) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest)))


def random_json(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        return rng.choice([*ODD_VALUES, random_text(rng)])
    if roll < 0.7:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_text(rng, 8): random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def dumps(value) -> bytes:
    """JSON as a client could send it: lone surrogates become \\ud800 escapes; NaN stays the bare word."""
    return json.dumps(value).encode()


def ordinary(task: str, text: str) -> dict:
    """An ordinary request of `task`, whose answer alone is known."""
    extra = {"text-generation": {"max_new_tokens": 6}, "multi-vector": {"input_type": "document"}}
    return {"inputs": text, **extra.get(task, {})}


def valid_body(rng: random.Random, task: str) -> dict:
    inputs = rng.choice(["hello world", ["alice in paris", "bob"], "the cat sat on the mat"])
    names = rng.sample(PARAMS[task], min(len(PARAMS[task]), rng.randint(0, 2)))
    params = {name: rng.choice(GOOD_VALUES[name]) for name in names}
    if task == "text-generation":
        params["max_new_tokens"] = rng.choice(GOOD_VALUES["max_new_tokens"])
    return {"inputs": inputs, **params}


def mutate(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data) + 1)
        action = rng.randrange(4)
        if action == 0 and data:
            del data[min(at, len(data) - 1)]
        elif action == 1:
            data[at:at] = rng.choice([b"{", b"}", b"[", b"]", b'"', b"\\", b",", b":", b"\\ud800", b"\xff", b"0"])
        elif action == 2:
            data = data[:at]
        else:
            data[at:at] = data[rng.randrange(len(data) + 1) :][:20]
    return bytes(data)


def v2_envelope(rng: random.Random, task: str) -> dict:
    data = rng.choice([["hello", "world"], [random_text(rng)], [1, 2], "text", [], [["nested"]]])
    tensor = {
        "name": rng.choice(["text", "", None, 5]),
        "shape": rng.choice([[len(data)] if isinstance(data, list) else [1], [], [-1], [2, 1], "2", [10**20]]),
        "datatype": rng.choice(["BYTES", "BYTES", "FP32", "INT64", None]),
        "data": data,
    }
    envelope = {"inputs": rng.choice([[tensor], [tensor, tensor], [tensor], [{}]])}
    if rng.random() < 0.5:
        envelope["id"] = rng.choice(["1", "\ud800", 7, None, random_text(rng, 10)])
    if rng.random() < 0.5:
        params = valid_body(rng, task)
        params.pop("inputs")
        envelope["parameters"] = rng.choice([params, random_json(rng), {"stream": True}])
    if rng.random() < 0.2:
        envelope[random_text(rng, 5)] = random_json(rng)
    return envelope


# Each task's OpenAI-style path and a well-formed body for it (token classification has none: a 404).
OPENAI_ROUTES = {
    "embedding": ["v1/embeddings", "v1/models", "v2/embed"],
    "text-classification": ["v1/rerank", "v2/rerank", "rerank"],
    "token-classification": ["v1/embeddings"],
    "text-generation": ["v1/completions", "v1/chat/completions", "v1/models"],
    "sparse-embedding": ["embed_sparse", "tokenize"],
    "multi-vector": ["v1/embeddings", "v2/embed", "rerank", "v1/rerank", "v2/rerank"],
    "m3-embedding": ["embed", "embed_sparse", "rerank", "v1/rerank", "v2/rerank", "tokenize"],
}
OPENAI_FIELDS = [
    "model", "input", "prompt", "messages", "encoding_format", "dimensions", "max_tokens", "temperature", "top_p",
    "seed", "stop", "stream", "stream_options", "n", "logprobs", "tools", "query", "documents", "top_n",
    "return_documents", "user",
]  # fmt: skip


# The tasks that serve TEI's tokenize route (handlers/protocols/tei.py); the others answer it 404.
TOKENIZE_TASKS = ("embedding", "text-classification", "sparse-embedding", "m3-embedding")


def huge_tokenize(rng: random.Random) -> bytes:
    """A tokenize body whose answer would pass the answer budget (6 MiB): one 650 KB text of
    325,000 tokens (~25 MB as TEI's answer), or 64 texts of 3,000 tokens (~12 MB)."""
    return dumps({"inputs": rng.choice(["a " * 325_000, ["a " * 3000] * 64])})


def openai_body(rng: random.Random, route: str, name: str) -> dict:
    body = {"model": rng.choice([name, name, "gpt-4", None, 5])}
    if route == "v1/embeddings":
        body["input"] = rng.choice(["hello world", ["a", "b"], [101, 7592, 102], [[101, 102], [7592]], [], [-1]])
        body["encoding_format"] = rng.choice(["float", "base64", "bits", None])
        body["input_type"] = rng.choice(["query", "document", "search_query", None])
    elif route == "v2/embed":  # Cohere's
        body["texts"] = rng.choice([["hello world"], ["a", "b"], [], "a", [5], None])
        body["embedding_types"] = rng.choice(
            [["float", "int8"], ["binary", "ubinary", "base64"], ["int4"], "float", [None]]
        )
        body[rng.choice(["input_type", "truncate", "output_dimension"])] = rng.choice(
            ["search_query", "END", 8, -1, {}]
        )
    elif route == "v1/completions":
        body.update(prompt=rng.choice(["the cat", ["a", "b"], [1, 2], ""]), max_tokens=rng.choice([1, 4, 0, 10**6]))
    elif route == "v1/chat/completions":
        content = rng.choice(["hi", [{"type": "text", "text": "hi"}], [{"type": "image_url"}], None])
        body.update(messages=[{"role": rng.choice(["user", "developer", "tool"]), "content": content}], max_tokens=3)
    elif route.startswith("embed") or route == "tokenize":
        body["inputs"] = rng.choice(["hello world", ["a", "b"], [], [1], "", None])
    elif route.endswith("rerank"):
        body.update(query=rng.choice(["q", "", 1]), documents=rng.choice([["a", "b"], [], "a", ["", 2]]))
    for field in rng.sample(OPENAI_FIELDS, rng.randint(0, 3)):
        body[field] = rng.choice(ODD_VALUES + [random_json(rng), True, 2, {"include_usage": True}])
    return body


def _bad_params(rng: random.Random, task: str) -> dict:
    body = valid_body(rng, task)
    for name in rng.sample(PARAMS[task], min(len(PARAMS[task]), rng.randint(1, 2))):
        body[name] = rng.choice(ODD_VALUES + [random_json(rng)])
    return body


def _deep(rng: random.Random, task: str) -> bytes:
    depth = rng.choice([17, 100, 990, 1100, 50_000])
    nested = b"[" * depth + b"]" * depth
    return rng.choice([nested, b'{"inputs": ' + nested + b"}", b'{"inputs": "x", "top_k": ' + nested + b"}"])


def _unicode(rng: random.Random, task: str) -> bytes:
    text = random_text(rng)
    return rng.choice([dumps({"inputs": text}), dumps({"inputs": [text, "ok"]}), text.encode("utf-8", "surrogatepass")])


_MAKERS = {  # kind -> the body of one hostile case of it
    "bytes": lambda rng, task: bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))),
    "json": lambda rng, task: dumps(random_json(rng)),
    "mutated": lambda rng, task: mutate(rng, dumps(valid_body(rng, task))),
    "unicode": _unicode,
    "params": lambda rng, task: dumps(_bad_params(rng, task)),
    "deep": _deep,
    "number": lambda rng, task: b'{"inputs": "x", "seed": ' + b"9" * rng.choice([4301, 20_000]) + b"}",
    # nested lists by the megabyte: a few bytes each on the wire, ~21x that as Python lists
    "nested": lambda rng, task: nested_lists(rng.uniform(0.2, 1.0), wrapped=rng.random() < 0.5),
}


def _body(rng: random.Random, task: str, kind: str) -> tuple[bytes, bool]:
    """(body, sent as v2) for one hostile case of `kind`."""
    if kind in _MAKERS:
        return _MAKERS[kind](rng, task), False
    if kind == "v2":
        return dumps(v2_envelope(rng, task)), True
    if kind in ("openai", "huge"):
        return b"", False  # made by hostile_cases, which knows the path
    return dumps(valid_body(rng, task)), rng.random() < 0.2  # "valid": a well-formed body, any content type


KINDS = [
    *("bytes", "json", "mutated", "unicode", "params", "deep", "number", "v2", "openai", "openai", "valid"),
    *("huge", "nested"),
]


def hostile_cases(task: str, seed: int, count: int, name: str = "model"):
    """`count` generated cases for `task` (served as `name`), the same for the same seed."""
    rng = random.Random(f"{task}-{seed}")
    for _ in range(count):
        kind = rng.choice(KINDS)
        body, v2 = _body(rng, task, kind)
        route = ""
        if kind == "huge":
            body, route = huge_tokenize(rng), "tokenize" if task in TOKENIZE_TASKS else ""
        if kind == "openai":
            route = rng.choice(OPENAI_ROUTES[task])
            openai = openai_body(rng, route, name)
            body = rng.choice([dumps(openai), dumps(openai), mutate(rng, dumps(openai))])
        content_type = "application/json" if rng.random() < 0.6 or kind == "huge" else rng.choice(CONTENT_TYPES)
        yield Case(kind, body, content_type, v2, route)


def torchserve_request(case: Case) -> dict:
    """The request dict a TorchServe worker hands `handle` for this body, decoded by TorchServe's own code."""
    from ts.protocol.otf_message_handler import _retrieve_input_data

    frame = b""
    for part in (b"body", case.content_type.encode(), case.body):
        frame += struct.pack("!i", len(part)) + part
    stream = _Stream(frame)
    parameter = _retrieve_input_data(stream)
    return {parameter["name"]: parameter["value"]}


class _Stream:
    """Stands in for the worker's socket: what TorchServe's frame reader receives."""

    def __init__(self, data: bytes):
        self.data = data

    def recv(self, size: int) -> bytes:
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


# -- bodies by the megabyte, and a batch of them: a few bytes each on the wire, ~21 times their size
# once JSON-decoded into Python lists (tests/unit/test_body_limits.py) ----------------------------
def nested_lists(megabytes: float, wrapped: bool = False) -> bytes:
    """`[[],[],...]` of about `megabytes` MB; in `{"inputs": ...}` if `wrapped`."""
    lists = b"[" + b",".join([b"[]"] * int(megabytes * 1_000_000 / 3)) + b"]"
    return b'{"inputs": ' + lists + b"}" if wrapped else lists


def nested_list_batch(seed: int, count: int, megabytes: float = 1.0) -> list[Case]:
    """A batch of `count` nested-list bodies of up to `megabytes` MB, plain or in `inputs`, the
    same for the same seed."""
    rng = random.Random(f"nested-lists-{seed}")
    return [
        Case("nested-megabytes", nested_lists(megabytes * rng.uniform(0.5, 1), rng.random() < 0.5), "application/json")
        for _ in range(count)
    ]


def batch_message(bodies: list[tuple[bytes, str]]) -> bytes:
    """TorchServe's frontend's message for one batch of (body, content type), as a worker's reader receives it."""

    def sized(data: bytes) -> bytes:
        return struct.pack("!i", len(data)) + data

    end = struct.pack("!i", -1)
    requests = [
        sized(f"request-{index}".encode()) + end + sized(b"body") + sized(content_type.encode()) + sized(body) + end
        for index, (body, content_type) in enumerate(bodies)
    ]
    return b"I" + b"".join(requests) + end
