"""bge-m3's three outputs from one pass, with the meaning of FlagEmbedding's `BGEM3FlagModel`.

The model is an XLM-R encoder with two heads FlagEmbedding saves beside it as PyTorch files,
`colbert_linear.pt` and `sparse_linear.pt` (read with `weights_only=True`, never unpickled freely).
One compiled graph gives every token its normalized state, its sparse weight and its normalized
ColBERT vector; the answer takes from them what the request asks, as FlagEmbedding's `encode`
names them (defaults as its own: dense only):
- `return_dense` -> `dense_vecs`: the first token's state (CLS pooling), normalized;
- `return_sparse` -> `lexical_weights`: `{"token id": weight}`, each id's largest
  `relu(sparse_linear(state))` over the text, special tokens (cls, eos, pad, unk) and zeros left out;
- `return_colbert_vecs` -> `colbert_vecs`: `colbert_linear(state)` normalized, from the second token on.
TEI's `embed` answers the dense vector, its `embed_sparse` the lexical weights as `{index, value}`.
Every rerank body (handlers/protocols/rerank_routes.py) embeds the query and the documents in one
call and scores each document as FlagEmbedding's `compute_score`: `weights` (dense, sparse,
colbert; [1, 1, 1] by default) weigh the dense dot product, the lexical match (the shared ids'
weights multiplied, summed) and the ColBERT score (each query vector's best dot product,
averaged), divided by their sum.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ts_compiled_handlers.engine.engine import KeptPart
from ts_compiled_handlers.graphs.m3_outputs import M3Outputs, read_heads
from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.protocols.rerank_routes import rerank_routes
from ts_compiled_handlers.protocols.tei import ROUTES as TEI_ROUTES
from ts_compiled_handlers.protocols.tei import TeiEmbedProtocol, TeiEmbedSparseProtocol
from ts_compiled_handlers.request.answers import M3, QueryVectors, Score, Sparse, Vector
from ts_compiled_handlers.request.payload import RequestError, boolean_param
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks.embedding import FLOAT_BYTES, EmbeddingTask
from ts_compiled_handlers.tasks.sparse_embedding import ENTRY_BYTES

OUTPUTS = {"return_dense": True, "return_sparse": False, "return_colbert_vecs": False}  # FlagEmbedding's defaults


def weights_param(value: Any, name: str) -> tuple[float, float, float]:
    numbers = isinstance(value, list) and all(
        isinstance(item, (int, float)) and not isinstance(item, bool) and 0 <= item < float("inf") for item in value
    )
    if not numbers or len(value) != 3 or not 0 < sum(value) < float("inf"):  # 1e308 three times overflows
        message = f"parameter '{name}' must be 3 numbers >= 0, not all 0: the dense, sparse and colbert weights"
        raise RequestError(400, message, name)
    return tuple(float(item) for item in value)


def lexical_score(query: dict, document: dict) -> float:
    return sum(weight * document[token] for token, weight in query.items() if token in document)


def index_order(weights: dict[str, float]) -> Sparse:
    """Lexical weights as a sparse embedding's entries, in index order."""
    indices = sorted(int(token) for token in weights)
    return Sparse(indices, [weights[str(index)] for index in indices])


def colbert_score(query: np.ndarray, document: np.ndarray) -> float:
    """FlagEmbedding's: each query vector's best dot product with the document's, averaged."""
    return float((query @ document.T).max(axis=1).sum() / len(query))


def always_normalized(value: Any, name: str) -> bool:
    """`normalize` as TEI's clients may send it: true, what bge-m3's dense vector always is."""
    if value is not True:
        raise RequestError(400, f"parameter '{name}' must be true: the dense vector is always normalized", name)
    return value


class M3EmbeddingTask(EmbeddingTask):
    """`{"inputs": "text", "return_sparse": true}` -> `{"dense_vecs": [...], "lexical_weights": {...}}`."""

    NAME = "m3-embedding"

    protocols = (*rerank_routes("maxsim"), PlainProtocol(), TeiEmbedProtocol(), TeiEmbedSparseProtocol(), *TEI_ROUTES)

    def keeps_token_states(self) -> bool:
        return True

    def read_settings(self, serving) -> None:
        self.heads = read_heads(serving.model_dir)  # read once: the sizes here, the module's weights below
        self.size = serving.model_config.hidden_size
        self.token_values = self.size + 1 + self.heads[0]["weight"].shape[0]  # state, sparse weight, ColBERT vector
        tokenizer = serving.tokenizer
        special = (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
        self.unused_ids = {token for token in special if token is not None}
        self.prompts, self.default_prompt, self.dimension_sizes, self.ranges = {}, None, None, None
        self.normalize_default = True

    def param_checks(self) -> dict:
        checks = {**super().param_checks(), **dict.fromkeys(OUTPUTS, boolean_param), "weights": weights_param}
        for unserved in ("dimensions", "precision", "prompt_name"):
            del checks[unserved]
        return {**checks, "normalize": always_normalized}

    def tei_model_type(self) -> dict:
        return {"embedding": {"pooling": "cls"}}

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModel

        encoder = AutoModel.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return M3Outputs(encoder, *self.heads)

    def check_request(self, request: Request) -> None:
        if request.token_ids is not None:
            raise RequestError(400, "'inputs': a bge-m3 model takes texts here, not token ids")
        asked = [name for name in (*OUTPUTS, "weights") if name in request.params]
        if request.scoring == "maxsim":
            if set(asked) - {"weights"}:
                raise RequestError(400, "a rerank body scores with all three outputs: send 'weights' instead", asked[0])
        elif "weights" in asked:
            raise RequestError(400, "'weights' weigh a rerank body's scores; embeddings take return_*", "weights")
        elif not any(self.outputs(request)):
            raise RequestError(400, "ask for at least one output: return_dense, return_sparse, return_colbert_vecs")

    def kept_part(self, accepted: Accepted) -> KeptPart | None:
        """What the answer reads of each text's (state | sparse weight | ColBERT vector) rows: the
        first token's only for the dense vector alone, the states and weights without the ColBERT
        vectors; whole rows for ColBERT, for scoring, and where a cache keeps rows for any request."""
        _, sparse, colbert = self.outputs(accepted.request)
        if colbert or accepted.request.scoring == "maxsim" or self.config.cache_bytes:
            return None
        return KeptPart(first_token=True) if not sparse else KeptPart(columns=self.size + 1)

    @staticmethod
    def outputs(request: Request) -> tuple[bool, bool, bool]:
        """(dense, sparse, colbert) as the request asks; TEI's routes each answer one of them."""
        if type(request.protocol) is TeiEmbedProtocol:
            return True, False, False
        if type(request.protocol) is TeiEmbedSparseProtocol:
            return False, True, False
        dense, sparse, colbert = (request.params.get(name, default) for name, default in OUTPUTS.items())
        return dense, sparse, colbert

    def lexical_weights(self, weights: torch.Tensor, ids: list[int]) -> dict[str, float]:
        """Each id's largest weight, in the order the ids come; specials and zeros left out."""
        found: dict[str, float] = {}
        for token, weight in zip(ids, weights.tolist(), strict=True):
            if weight > 0 and token not in self.unused_ids and weight > found.get(str(token), 0.0):
                found[str(token)] = weight
        return found

    def split(self, row: torch.Tensor, ids: list[int], sparse: bool) -> tuple[np.ndarray, dict, np.ndarray]:
        """A text's (T, H + 1 + C) outputs as its dense vector, lexical weights (if `sparse`: a loop
        over its tokens) and ColBERT vectors."""
        size = self.size
        values = row.numpy()
        dense = np.ascontiguousarray(values[0, :size], dtype=np.float32)
        colbert = np.ascontiguousarray(values[1:, size + 1 :], dtype=np.float32)
        return dense, self.lexical_weights(row[:, size], ids) if sparse else {}, colbert

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        request = accepted.request
        dense, sparse, colbert = self.outputs(request)
        scoring = request.scoring == "maxsim"
        texts = [self.split(row, ids, sparse or scoring) for row, ids in zip(rows, accepted.token_ids, strict=True)]
        if scoring:
            return self.scores(request, texts)
        if request.protocol is not None:  # answered as JSON: its least size, before it is made
            least = sum(
                (dense * len(vector) + colbert * vectors.size) * FLOAT_BYTES + sparse * len(weights) * ENTRY_BYTES
                for vector, weights, vectors in texts
            )
            remedy = "send fewer or shorter texts, or ask for fewer outputs"
            self.budget.check(least, 1, "bytes of vectors and weights", request.protocol.texts_field, remedy)
        if type(request.protocol) is TeiEmbedProtocol:
            return [Vector(vector) for vector, _, _ in texts]
        if type(request.protocol) is TeiEmbedSparseProtocol:
            return [index_order(weights) for _, weights, _ in texts]
        return [
            M3(vector if dense else None, weights if sparse else None, vectors if colbert else None)
            for vector, weights, vectors in texts
        ]

    def scores(self, request: Request, texts: list) -> list:
        """The query's answer first (how many ColBERT vectors it has), then each document's score."""
        w_dense, w_sparse, w_colbert = request.params.get("weights", (1.0, 1.0, 1.0))
        (query_dense, query_weights, query_vectors), documents = texts[0], texts[1:]
        scores = []
        for dense, weights, vectors in documents:
            combined = (
                w_dense * float(query_dense @ dense)
                + w_sparse * lexical_score(query_weights, weights)
                + w_colbert * colbert_score(query_vectors, vectors)
            )
            scores.append(Score(combined / (w_dense + w_sparse + w_colbert)))
        return [QueryVectors(len(query_vectors)), *scores]
