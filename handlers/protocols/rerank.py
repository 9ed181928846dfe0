"""Reranking: one query against documents, answered best first with the cross-encoder's scores.

    {"query": q, "documents": ["d0", "d1", ...], "top_n": 2, "return_documents": false, <task parameters>}
 -> [{"index": 1, "score": 0.93}, {"index": 0, "score": 0.12}]      ("document": "d1" too with return_documents)

Each document is scored as the pair (query, document), with the score sentence-transformers'
`CrossEncoder.predict` gives (its activation: handlers/tasks/labels.py). Ties keep the documents' order.
Served on the model's own path and at `rerank` (where TEI's own body, with `texts`, goes to
handlers/protocols/tei.py), and at `v1/rerank` in the body
Cohere and Jina answer with, `{"model", "results": [{"index", "relevance_score", "document":
{"text"}}], "usage"}`, refusals in OpenAI's error shape (handlers/protocols/openai.py).
"""

import dataclasses
from typing import Any

from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.protocols.openai import OpenAIProtocol
from ts_compiled_handlers.request.payload import RequestError, check_params, check_texts

FIELDS = ("query", "documents", "top_n", "return_documents")


@dataclasses.dataclass(frozen=True)
class RerankForm:
    top_n: int | None  # None: every document
    return_documents: bool


class RerankProtocol(Protocol):
    routes = ("", "rerank")
    texts_field = "documents"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict) and "query" in value and "documents" in value

    def read(self, value: Any, spec: RequestSpec) -> Request:
        if not spec.pairs and self.accepts(value):
            raise RequestError(400, "this model does not rerank: it is not a cross-encoder (text-classification)")
        query, documents, params, form = read_body(value, spec)
        return Request([(query, document) for document in documents], params, self, scoring="rerank", form=form)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return ranked(request, [answer["score"] for answer in answers])


def read_body(value: Any, spec: RequestSpec) -> tuple[str, list[str], dict, RerankForm]:
    """The query, the documents, the task's parameters and the form of a rerank body."""
    if not isinstance(value, dict) or "query" not in value or "documents" not in value:
        raise RequestError(400, "the body must be a JSON object with 'query' and 'documents'", "query")
    if not isinstance(value["query"], str):
        raise RequestError(400, "'query' must be a string", "query")
    (query,) = check_texts([value["query"]], 1)
    documents = value["documents"]
    if not isinstance(documents, list):
        raise RequestError(400, "'documents' must be a list of strings", "documents")
    documents = check_texts(documents, spec.max_inputs)
    top_n = value.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise RequestError(400, "'top_n' must be an integer >= 1 (or left out: every document)", "top_n")
    return_documents = value.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise RequestError(400, "'return_documents' must be true or false", "return_documents")
    params = check_params({key: item for key, item in value.items() if key not in FIELDS}, spec.params)
    return query, documents, params, RerankForm(top_n, return_documents)


def ranked(request: Request, scores: list[float], text_key: str = "document") -> list[dict]:
    """`{index, score[, document]}` per document, best first, the first `top_n` (TEI names the
    text `text`)."""
    order = sorted(range(len(scores)), key=lambda index: -scores[index])[: request.form.top_n]
    documents = request.texts[1:] if request.scoring == "maxsim" else [text[1] for text in request.texts]
    results = []
    for index in order:
        result = {"index": index, "score": scores[index]}
        if request.form.return_documents:
            result[text_key] = documents[index]
        results.append(result)
    return results


class MaxSimRerankProtocol(RerankProtocol):
    """The same body on a multi-vector (ColBERT) model: its texts are the query, then the documents,
    each embedded as what it is and scored by MaxSim (handlers/tasks/multi_vector.py); the first
    answer is the query's."""

    def read(self, value: Any, spec: RequestSpec) -> Request:
        query, documents, params, form = read_body(value, spec)
        return Request([query, *documents], params, self, scoring="maxsim", form=form)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return ranked(request, [answer["score"] for answer in answers[1:]])


class CohereRerankProtocol(RerankProtocol):
    """`POST v1/rerank`: the same body, answered in Cohere's and Jina's shape."""

    routes = ("v1/rerank",)
    error = OpenAIProtocol.error

    def accepts(self, value: Any) -> bool:
        return True

    def read(self, value: Any, spec: RequestSpec) -> Request:
        value = OpenAIProtocol.body_object(value, spec)
        return super().read({key: item for key, item in value.items() if key != "model"}, spec)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        results = [
            {
                "index": one["index"],
                "relevance_score": one["score"],
                **({"document": {"text": one["document"]}} if "document" in one else {}),
            }
            for one in ranked(request, [answer["score"] for answer in answers])
        ]
        return {"model": served.model_name, "results": results, "usage": {"total_tokens": prompt_tokens}}
