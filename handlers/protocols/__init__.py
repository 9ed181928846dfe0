"""Request protocols: how a body becomes one typed `Request`, and how its answers become the body sent back.

A protocol is a plug-in: one module with one `Protocol` subclass, listed in a task's
`protocols`. The worker picks the protocol by the request's extra path (TorchServe's `url_path`
header: `/predictions/{model}/{version}/<route>`, "" for `/predictions/{model}`) and, among the
protocols of that route, by the body (`accepts`). Reading checks everything a client sent before
any model work (a `RequestError` names what was wrong, without echoing the input); encoding turns
the task's per-text answers into the protocol's body, and a refusal into its error body.
"""

import dataclasses
import json
from typing import Any, Callable, Literal

from ts_compiled_handlers.request.answer_budget import AnswerBudget
from ts_compiled_handlers.request.answers import Generated
from ts_compiled_handlers.request.payload import ParamCheck, RequestError

# The deepest JSON any request needs is 4 levels (a KServe v2 body); deeper is refused before any
# work, so no step ever recurses on what a client nested.
MAX_JSON_DEPTH = 16


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """What a task accepts, for the protocols to check against: its parameters, the most texts
    per request, its own body forms rewritten to the common one (chat messages to a prompt), and
    the most bytes an answer may take."""

    params: dict[str, ParamCheck]
    max_inputs: int
    adapt: Callable[[Any], Any] = lambda value: value
    pairs: bool = False  # the task takes text pairs (a cross-encoder: query and passage)
    model_name: str = ""  # the archive's name, as registered (the OpenAI bodies name it)
    tokenizer: Any = None  # the model's tokenizer, for routes answered without the model (TEI's tokenize)
    info: dict = dataclasses.field(default_factory=dict)  # what TEI's `info` says of the model
    prompts: dict = dataclasses.field(default_factory=dict)  # the model's named prompts (embedders)
    budget: AnswerBudget = AnswerBudget()  # what one answer may take (handlers/request/answer_budget.py)


@dataclasses.dataclass(frozen=True)
class Request:
    """One decoded request, what every task reads: its texts (or text pairs), the task's checked
    parameters, and the protocol that answers it. `is_list`: the texts came as a list (answered as
    a list); `token_ids`: the model's input as a client sent it (then `texts` are placeholders);
    `scoring`: `rerank` scores each pair as a cross-encoder ranks it, `labels` as a classifier,
    `maxsim` the query (the first text) against the documents (the others) by late interaction.
    `token_states`: each token's vector, not one per text (TEI's `embed_all`).
    `form`: the protocol's own fields, a dataclass of its module that only that protocol reads.
    `images`: the request's images, decoded and preprocessed, and where each stands among its
    inputs (tasks that take images: handlers/protocols/image_bodies.py)."""

    texts: list[str] | list[tuple[str, str]]
    params: dict[str, Any]
    protocol: "Protocol | None"  # None: an in-process caller (Ray Data), answered as arrays
    is_list: bool = True
    token_ids: list[list[int]] | None = None
    scoring: Literal["labels", "rerank", "maxsim"] = "labels"
    token_states: bool = False
    form: Any = None
    images: Any = None

    @property
    def texts_field(self) -> str | None:
        """The body's field of texts, named in a refusal (None: an in-process caller)."""
        return self.protocol.texts_field if self.protocol is not None else None


@dataclasses.dataclass(frozen=True)
class Served:
    """Who answers: the model's name and version, as TorchServe registered them."""

    model_name: str
    model_version: str | None


class Answered(Exception):
    """Raised by `read` for a request its protocol answers alone, without the model (a listing
    of the served model): `body` is the whole answer."""

    def __init__(self, body: Any):
        super().__init__("answered without the model")
        self.body = body


class Protocol:
    """One way of talking to the handler. Subclasses set `routes` and implement `decode` and `encode`."""

    routes: tuple[str, ...] = ("",)  # the `url_path` values it serves
    texts_field = "inputs"  # the body's field of texts, named when an answer would be too large
    content_type = "application/json"
    reads_body = True  # False: answered whatever the body (a GET without one)
    takes_image_body = False  # True: reads an image/* body, handed over as bytes (`body_value`)

    def accepts(self, value: Any) -> bool:
        """Whether a body read from JSON or text (`body_value`) is this protocol's."""
        return True

    def read(self, value: Any, spec: RequestSpec) -> Request:
        """The request a body (JSON or text, `payload.body_value`) makes, checked."""
        raise NotImplementedError

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        """The body for the task's answers (handlers/request/answers.py), one per text of `request`
        (`prompt_tokens`: its usage)."""
        raise NotImplementedError

    def error(self, error: RequestError) -> Any:
        """The body of a refusal."""
        return error.body()

    # Streamed answers (text generation with `stream: true`), for protocols that stream.
    stream_content_type = "application/jsonl"

    def stream_pieces(self, request: Request, pieces: list[tuple[int, str]]) -> str:
        """What to send of new text (`(text index, piece)` per prompt) while the request generates."""
        raise RequestError(400, "this protocol does not stream")

    def stream_end(
        self, request: Request, pieces: list[tuple[int, str]], results: list[Generated], prompt_tokens=0
    ) -> str:
        """The stream's last message: the pieces not yet sent, then each prompt's result."""
        raise RequestError(400, "this protocol does not stream")


def unknown_route(route: str, protocols) -> RequestError:
    known = sorted({"/" + path if path else "(none)" for protocol in protocols for path in protocol.routes})
    return RequestError(404, f"this model has no endpoint /{route}; its paths after the version: {', '.join(known)}")


def read_request(body: Any, content_type: str | None, route: str, protocols, spec: RequestSpec) -> Request:
    """The request a body makes, read by the first of the route's protocols that takes it; a 404
    for a route no protocol serves, `Answered` for an answer without the model."""
    served = for_route(route, protocols)
    if not served:
        raise unknown_route(route, protocols)
    if not served[0].reads_body:
        return served[0].read(None, spec)
    value = body_value(body, content_type)
    if isinstance(value, bytes) and not any(protocol.takes_image_body for protocol in served):
        raise RequestError(
            415, "an image body is not read here: image-text-embedding archives take one on their predictions path"
        )
    return next((protocol for protocol in served if protocol.accepts(value)), served[-1]).read(value, spec)


def for_route(route: str, protocols) -> list[Protocol]:
    """The protocols that serve `route` (the `url_path` header, without slashes at its ends)."""
    return [protocol for protocol in protocols if route in protocol.routes]


def route_protocol(route: str, protocols) -> Protocol:
    """The route's last protocol, whose shape its refusals take (the plain one for an unknown route)."""
    served = for_route(route, protocols)
    return served[-1] if served else Protocol()


def body_value(value: Any, content_type: str | None) -> Any:
    """The body as a server handed it over (bytes, or text or JSON its frontend already read), as
    text or a JSON value."""
    if isinstance(value, (bytes, bytearray)) and value and (content_type or "").startswith("image/"):
        return bytes(value)  # an image as the body: read by a protocol that takes images, refused by the others
    if isinstance(value, (bytes, bytearray)):
        value = _from_bytes(value, content_type) if value else ""
    if value is None or value == "":  # no body, or JSON's empty string (as TorchServe's backend reads it)
        raise RequestError(400, 'empty request body: send text, or JSON {"inputs": ...}')
    check_depth(value)
    return value


def _from_bytes(raw: bytes | bytearray, content_type: str | None) -> Any:
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, "request body is not valid UTF-8") from error
    if content_type and "json" in content_type:
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise RequestError(400, f"request body is not valid JSON ({error.msg} at position {error.pos})") from error
        except RecursionError as error:
            raise RequestError(400, f"JSON body is nested deeper than {MAX_JSON_DEPTH} levels") from error
        except ValueError as error:  # e.g. an integer past Python's 4300-digit conversion limit
            raise RequestError(400, "JSON body holds a number that cannot be read") from error
    return text


def check_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON nested deeper than `limit`, walking it without recursion."""
    level = [value]
    for _ in range(limit):
        level = [
            child
            for node in level
            if isinstance(node, (dict, list))
            for child in (node.values() if isinstance(node, dict) else node)
        ]
        if not level:
            return
    if any(isinstance(node, (dict, list)) for node in level):
        raise RequestError(400, f"JSON body is nested deeper than {limit} levels")
