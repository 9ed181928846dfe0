"""TEI's (text-embeddings-inference) routes, bodies and errors, under the model's own path, so that
clients written for TEI work with the URL `/predictions/{name}/{version}` as their base:

    POST embed     {"inputs": "a" | ["a", "b"], "normalize", "truncate", "truncation_direction",
                    "prompt_name", "dimensions"}                     -> [[...], [...]] (always a list)
    POST embed_all {"inputs", "truncate", "truncation_direction", "prompt_name"}
                                                     -> [[[...] per token], ...] (archives that keep token states)
    POST embed_sparse {"inputs", "truncate", "truncation_direction", "prompt_name", "top_k", "threshold"}
                                                     -> [[{"index", "value"}, ...], ...] (sparse encoders)
    POST predict   {"inputs": "a" | ["q", "p"] | [...], "raw_scores", "truncate", ...}
                                                     -> [{"label", "score"}] best first (a list each for a batch)
    POST rerank    {"query", "texts", "raw_scores", "return_text", "truncate", ...}
                                                     -> [{"index", "score"[, "text"]}] best first (every ranker)
    POST tokenize  {"inputs": "a" | [...], "add_special_tokens", "prompt_name"}
                                                     -> [[{"id", "text", "special", "start", "stop"}]]
    POST decode    {"ids": [1, 2] | [[...]], "skip_special_tokens"}  -> ["text", ...]
    GET  info      model_id, model_type, max_input_length, max_batch_tokens, max_client_batch_size...

A body may also carry its options in a `parameters` object (the HF Inference API's convention,
which huggingface_hub's client uses); options it sends as null are left out. TEI's `Left` and
`Right` truncation directions are taken in either case. Refusals are TEI's `{"error", "error_type"}`.
`tokenize` counts characters for `start`/`stop` (Python's offsets), where TEI counts bytes, and is
held to the answer budget (handlers/request/answer_budget.py) before its answer is made.
"""

import dataclasses
from typing import Any

from ts_compiled_handlers.protocols import Answered, Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.protocols.rerank import Ranking, RerankForm, ranked
from ts_compiled_handlers.request.answers import written
from ts_compiled_handlers.request.payload import RequestError, boolean_param, check_params, check_texts
from ts_compiled_handlers.request.tokenizing import CHARACTERS_PER_TOKEN

ERROR_TYPES = {429: "Overloaded", 503: "Overloaded"}  # other 4xx: Validation, other 5xx: Backend
# The fewest bytes one token takes in a tokenize answer: {"id":0,"text":"","special":true,"start":0,"stop":0},
TOKEN_BYTES = 53


def body_object(value: Any, required: str) -> dict:
    """The body as one object: `parameters` merged in, nulls dropped, TEI's directions lowercased."""
    if not isinstance(value, dict) or required not in value:
        raise RequestError(422, f"the body must be a JSON object with '{required}'", required)
    parameters = value.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise RequestError(422, "'parameters' must be an object", "parameters")
    merged = {key: item for key, item in {**value, **parameters}.items() if key != "parameters" and item is not None}
    if required not in merged:  # sent as null
        raise RequestError(422, f"'{required}' must not be null", required)
    if isinstance(merged.get("truncation_direction"), str):
        merged["truncation_direction"] = merged["truncation_direction"].lower()
    return merged


class TeiProtocol(Protocol):
    """What TEI's routes share: its error shape."""

    def error(self, error: RequestError) -> Any:
        kind = ERROR_TYPES.get(error.status, "Backend" if error.status >= 500 else "Validation")
        return {"error": error.message, "error_type": kind}


def texts_of(inputs: Any, spec: RequestSpec) -> list[str]:
    if isinstance(inputs, str):
        return check_texts([inputs], spec.max_inputs)
    if not isinstance(inputs, list):
        raise RequestError(422, "'inputs' must be a string or a list of strings", "inputs")
    return check_texts(inputs, spec.max_inputs)


class TeiEmbedProtocol(TeiProtocol):
    routes = ("embed",)

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = body_object(value, "inputs")
        texts = texts_of(body.pop("inputs"), spec)
        return Request(texts, check_params(body, spec.params), self)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return [answer.embedding for answer in answers]


class TeiEmbedAllProtocol(TeiEmbedProtocol):
    """Every token's last hidden state, special tokens included, in the text's order."""

    routes = ("embed_all",)

    def read(self, value: Any, spec: RequestSpec) -> Request:
        return dataclasses.replace(super().read(value, spec), token_states=True)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return [answer.token_states for answer in answers]


class TeiEmbedSparseProtocol(TeiEmbedProtocol):
    """Sparse encoders: each text's non-zero entries, `[{"index", "value"}]` in index order."""

    routes = ("embed_sparse",)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return [
            [{"index": index, "value": value} for index, value in zip(answer.indices, answer.values, strict=True)]
            for answer in answers
        ]


@dataclasses.dataclass(frozen=True)
class PredictForm:
    single: bool  # one text or one pair: answered with one list of labels


class TeiPredictProtocol(TeiProtocol):
    """Classifiers: every label, best first. As in TEI, a list of two strings is one text pair."""

    routes = ("predict",)

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = body_object(value, "inputs")
        inputs = body.pop("inputs")
        single = isinstance(inputs, str) or (_is_pair(inputs) and spec.pairs)
        sequences = [inputs] if single else inputs
        if not isinstance(sequences, list):
            raise RequestError(422, "'inputs' must be a text, a [text, text] pair, or a list of either", "inputs")
        if any(_is_pair(sequence) for sequence in sequences):
            if not spec.pairs or not all(_is_pair(sequence) for sequence in sequences):
                raise RequestError(422, "'inputs' mixes texts and pairs, or this model takes no pairs", "inputs")
            firsts = check_texts([pair[0] for pair in sequences], spec.max_inputs)
            texts = list(zip(firsts, check_texts([pair[1] for pair in sequences], spec.max_inputs), strict=True))
        else:
            texts = check_texts(sequences, spec.max_inputs)
        params = check_params({"top_k": None, **body}, spec.params)  # every label, as TEI answers
        return Request(texts, params, self, is_list=not single, form=PredictForm(single))

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return written(answers[0] if request.form.single else answers)


def _is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(item, str) for item in value)


class TeiRerankProtocol(Ranking, TeiProtocol):
    """TEI's rerank body (`texts`, `return_text`); ours (`documents`) is handlers/protocols/rerank.py."""

    routes = ("rerank",)
    texts_field = "texts"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict) and "texts" in value

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = body_object(value, "texts")
        if self.scoring == "rerank" and not spec.pairs:
            raise RequestError(422, "this model does not rerank: it is not a cross-encoder (text-classification)")
        query, texts = body.pop("query", None), body.pop("texts")
        if not isinstance(query, str) or not isinstance(texts, list):
            raise RequestError(422, "'query' must be a string and 'texts' a list of strings", "query")
        (query,) = check_texts([query], 1, "query")
        texts = check_texts(texts, spec.max_inputs, "texts")
        return_text = boolean_param(body.pop("return_text", False), "return_text")
        if self.scoring == "maxsim":  # a MaxSim score has no activation to leave out: raw or not, the same
            boolean_param(body.pop("raw_scores", False), "raw_scores")
        return self.ranking(query, texts, check_params(body, spec.params), RerankForm(None, return_text))

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return ranked(request, answers, text_key="text")


class TeiTokenizeProtocol(TeiProtocol):
    """Answered by the tokenizer alone, without the model. As in TEI, every token of a text is
    answered (none is cut), and a text of more than 250 characters per token of the model's limit
    is refused with 413 before it is tokenized; the texts' tokens together are held to the answer
    budget before any of their answer is made (a 650 KB text made a 25 MB answer, ~320 MB of dicts)."""

    routes = ("tokenize",)

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = body_object(value, "inputs")
        texts = check_characters(texts_of(body.pop("inputs"), spec), spec)
        special = boolean_param(body.pop("add_special_tokens", True), "add_special_tokens")
        prompt = body.pop("prompt_name", None)
        check_params(body, {})
        if prompt is not None:
            if not isinstance(prompt, str) or prompt not in spec.prompts:
                raise RequestError(422, "'prompt_name' must name one of the model's prompts", "prompt_name")
            texts = [spec.prompts[prompt] + text for text in texts]
        encoded = encodings(texts, special, spec)
        raise Answered([tokens(spec.tokenizer, text, encoding) for text, encoding in zip(texts, encoded, strict=True)])


def check_characters(texts: list[str], spec: RequestSpec) -> list[str]:
    """TEI's bound on what it tokenizes: at most 250 characters per token of the model's limit."""
    limit = CHARACTERS_PER_TOKEN * spec.info.get("max_input_length", 1 << 20)
    for position, text in enumerate(texts):
        if len(text) > limit:
            message = f"'inputs'[{position}] has {len(text)} characters; at most {limit}, as TEI tokenizes"
            raise RequestError(413, message, "inputs")
    return texts


def encodings(texts: list[str], add_special_tokens: bool, spec: RequestSpec) -> list:
    """Each text's ids and offsets, the budget checked after each text: what is held stays near it."""
    encoded, count = [], 0
    for text in texts:
        encoded.append(
            spec.tokenizer(
                text,
                add_special_tokens=add_special_tokens,
                return_offsets_mapping=True,
                return_token_type_ids=False,
                return_attention_mask=False,
            )
        )
        count += len(encoded[-1]["input_ids"])
        spec.budget.check(count, TOKEN_BYTES, "tokens", "inputs", "send fewer or shorter texts in 'inputs'")
    return encoded


def tokens(tokenizer, text: str, encoded) -> list[dict]:
    """A text's tokens in TEI's form, from its encoding (ids and character offsets)."""
    specials = set(tokenizer.all_special_ids)
    answer = []
    for token_id, (start, stop) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True):
        special = token_id in specials
        piece = tokenizer.convert_ids_to_tokens(token_id) if special else text[start:stop]
        answer.append({"id": token_id, "text": piece, "special": special, "start": start, "stop": stop})
    return answer


class TeiDecodeProtocol(TeiProtocol):
    routes = ("decode",)
    texts_field = "ids"

    def read(self, value: Any, spec: RequestSpec) -> Request:
        body = body_object(value, "ids")
        ids = body.pop("ids")
        skip = boolean_param(body.pop("skip_special_tokens", True), "skip_special_tokens")
        check_params(body, {})
        rows = ids if isinstance(ids, list) and ids and all(isinstance(row, list) for row in ids) else [ids]
        vocabulary = len(spec.tokenizer)
        for row in rows:
            if not isinstance(row, list) or not row or len(row) > spec.info.get("max_input_length", 1 << 20):
                raise RequestError(422, "'ids' must be a non-empty list of token ids, or a list of those", "ids")
            if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocabulary for i in row):
                raise RequestError(422, f"'ids' must be integers from 0 to {vocabulary - 1}", "ids")
        if len(rows) > spec.max_inputs:
            raise RequestError(413, f"'ids' has {len(rows)} rows; at most {spec.max_inputs} per request", "ids")
        raise Answered([spec.tokenizer.decode(row, skip_special_tokens=skip) for row in rows])


class TeiInfoProtocol(TeiProtocol):
    """`GET info`: what TEI's clients read of the model, answered without it."""

    routes = ("info",)
    reads_body = False

    def read(self, value: Any, spec: RequestSpec) -> Request:
        raise Answered(spec.info)


ROUTES = (TeiTokenizeProtocol(), TeiDecodeProtocol(), TeiInfoProtocol())  # every TEI task's
