"""Reranking: one query against documents, answered best first with the archive's scores.

    {"query": q, "documents": ["d0", "d1", ...], "top_n": 2, "return_documents": false, <task parameters>}
 -> [{"index": 1, "score": 0.93}, {"index": 0, "score": 0.12}]      ("document": "d1" too with return_documents)

Every archive that ranks answers every rerank shape (the list: handlers/protocols/rerank_routes.py),
so a client switches archives without changing its body. `scoring` says how the archive scores:
`rerank`, each document as the pair (query, document), with the score sentence-transformers'
`CrossEncoder.predict` gives (its activation: handlers/tasks/labels.py); `maxsim`, the query then
the documents, each embedded as what it is (ColBERT, bge-m3: handlers/tasks/multi_vector.py, m3.py),
the query's answer first. Ties keep the documents' order.
Served on the model's own path and at `rerank` (where TEI's own body, with `texts`, goes to
handlers/protocols/tei.py); at `v1/rerank` in the body Cohere's v1 and Jina answer with,
`{"model", "results": [{"index", "relevance_score", "document": {"text"}}], "usage"}`, refusals
in OpenAI's error shape (handlers/protocols/openai.py); at `v2/rerank` in Cohere's v2 body,
`{"id", "results": [{"index", "relevance_score"}], "meta"}`, refusals as Cohere's `{"message"}`.
"""

import dataclasses
import uuid
from typing import Any, Literal

from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.protocols.cohere import CohereEmbedProtocol
from ts_compiled_handlers.protocols.openai import OpenAIProtocol
from ts_compiled_handlers.request.payload import RequestError, check_params, check_texts

FIELDS = ("query", "documents", "top_n", "return_documents")
COHERE_V2_UNSERVED = ("max_tokens_per_doc", "relevant_spans")  # the archive's length rule holds; no spans


@dataclasses.dataclass(frozen=True)
class RerankForm:
    top_n: int | None  # None: every document
    return_documents: bool


class Ranking:
    """What every rerank shape shares: its documents scored as the archive scores them (`scoring`),
    so that one body class serves a cross-encoder and a multi-vector model alike."""

    def __init__(self, scoring: Literal["rerank", "maxsim"] = "rerank"):
        self.scoring = scoring

    def ranking(self, query: str, documents: list[str], params: dict, form: RerankForm) -> Request:
        """The request scoring `documents` against `query`: pairs, or the query then the documents."""
        texts = [query, *documents] if self.scoring == "maxsim" else [(query, document) for document in documents]
        return Request(texts, params, self, scoring=self.scoring, form=form)


class RerankProtocol(Ranking, Protocol):
    routes = ("", "rerank")
    texts_field = "documents"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict) and "query" in value and "documents" in value

    def read(self, value: Any, spec: RequestSpec) -> Request:
        if self.scoring == "rerank" and not spec.pairs and self.accepts(value):
            raise RequestError(400, "this model does not rerank: it is not a cross-encoder (text-classification)")
        return self.ranking(*read_body(value, spec))

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return ranked(request, answers)


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


def ranked(request: Request, answers: list, text_key: str = "document") -> list[dict]:
    """`{index, score[, document]}` per document, best first, the first `top_n` (TEI names the
    text `text`); a MaxSim request's first answer is its query's, not a document's."""
    maxsim = request.scoring == "maxsim"
    scores = [answer.score for answer in (answers[1:] if maxsim else answers)]
    documents = request.texts[1:] if maxsim else [text[1] for text in request.texts]
    results = []
    for index in sorted(range(len(scores)), key=lambda index: -scores[index])[: request.form.top_n]:
        result = {"index": index, "score": scores[index]}
        if request.form.return_documents:
            result[text_key] = documents[index]
        results.append(result)
    return results


class CohereRerankProtocol(RerankProtocol):
    """`POST v1/rerank`: the same body, answered in Cohere's v1 and Jina's shape."""

    routes = ("v1/rerank",)
    error = OpenAIProtocol.error

    def accepts(self, value: Any) -> bool:
        return True

    def read(self, value: Any, spec: RequestSpec) -> Request:
        value = OpenAIProtocol.body_object(value, spec)
        return super().read({key: item for key, item in value.items() if key != "model"}, spec)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        results = cohere_results(ranked(request, answers))
        return {"model": served.model_name, "results": results, "usage": {"total_tokens": prompt_tokens}}


class CohereV2RerankProtocol(CohereRerankProtocol):
    """`POST v2/rerank`: Cohere's v2 body (`model`, `query`, `documents`, `top_n`), as
    `cohere.ClientV2(base_url=<the archive's path>).rerank` sends it; `priority` is taken and ignored."""

    routes = ("v2/rerank",)
    error = CohereEmbedProtocol.error

    def read(self, value: Any, spec: RequestSpec) -> Request:
        value = {key: item for key, item in OpenAIProtocol.body_object(value, spec).items() if item is not None}
        for name in COHERE_V2_UNSERVED:
            if name in value:
                raise RequestError(400, f"'{name}' is not served here (the archive's length limit holds)", name)
        return super().read({key: item for key, item in value.items() if key != "priority"}, spec)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        meta = {"api_version": {"version": "2"}, "billed_units": {"input_tokens": prompt_tokens}}
        return {"id": str(uuid.uuid4()), "results": cohere_results(ranked(request, answers)), "meta": meta}


def cohere_results(ranked: list[dict]) -> list[dict]:
    """Our ranked answers as Cohere names them: `relevance_score`, the document as `{"text"}`."""
    return [
        {
            "index": one["index"],
            "relevance_score": one["score"],
            **({"document": {"text": one["document"]}} if "document" in one else {}),
        }
        for one in ranked
    ]
