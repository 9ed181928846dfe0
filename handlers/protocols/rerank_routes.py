"""Every rerank shape in one list, so that every archive that ranks (a cross-encoder, an LLM
reranker, ColBERT, bge-m3) answers all of them, and a client switches archives, not bodies:

    ""          ours: {"query", "documents", "top_n", "return_documents"}   (handlers/protocols/rerank.py)
    rerank      TEI's {"query", "texts", "return_text", "raw_scores"}, else ours   (handlers/protocols/tei.py)
    v1/rerank   Cohere's v1 and Jina's: ours with "model"; {"model", "results", "usage"}
    v2/rerank   Cohere's v2: {"model", "query", "documents", "top_n"}; {"id", "results", "meta"}

`scoring` is the archive's: `rerank` (text pairs) or `maxsim` (the query, then the documents).
"""

from typing import Literal

from ts_compiled_handlers.protocols import Protocol
from ts_compiled_handlers.protocols.rerank import CohereRerankProtocol, CohereV2RerankProtocol, RerankProtocol
from ts_compiled_handlers.protocols.tei import TeiRerankProtocol


def rerank_routes(scoring: Literal["rerank", "maxsim"] = "rerank") -> tuple[Protocol, ...]:
    """The rerank protocols, TEI's before ours at `rerank` (it takes `texts` bodies, ours `documents`)."""
    return (
        TeiRerankProtocol(scoring),
        RerankProtocol(scoring),
        CohereRerankProtocol(scoring),
        CohereV2RerankProtocol(scoring),
    )
