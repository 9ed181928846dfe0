"""Multi-vector (ColBERT, late interaction) embeddings with the meaning of PyLate's `ColBERT.encode`.

The model is a folder PyLate saves: a Transformer, a Dense projection without bias (`1_Dense`), and
in config_sentence_transformers.json the query and document prefixes, their lengths, query
expansion and the skiplist. Every text gets one vector per token, projected and normalized inside
the compiled graph (handlers/graphs/late_interaction.py). `input_type` says what a text is, and is
required (the two give different vectors, and a wrong guess fails silently):
- `query`: the query prefix after the first token, cut at `query_length`, then the mask token up
  to that length (query expansion; attended to only where `attend_to_expansion_tokens`); a
  vector per token, expansions included;
- `document`: the document prefix, the archive's length rule (PyLate cuts at `document_length`),
  and a vector per token but the skiplist's (punctuation).
Every rerank body (ours, TEI's, Cohere's and Jina's: handlers/protocols/rerank_routes.py) embeds
the query as a query and the documents as documents, in one call, and scores each by MaxSim: for
each query vector the largest dot product with the document's vectors, summed.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ts_compiled_handlers.graphs.late_interaction import ColbertSettings, TokenVectors, maxsim, read_projection
from ts_compiled_handlers.graphs.model_files import read_json
from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.protocols.cohere import CohereEmbedProtocol
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.openai import EmbeddingsProtocol, ModelsProtocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.protocols.rerank_routes import rerank_routes
from ts_compiled_handlers.request.answers import MultiVector, QueryVectors, Score, Vectors
from ts_compiled_handlers.request.payload import RequestError, choice_param
from ts_compiled_handlers.request.tokenizing import Accepted, Tokenized
from ts_compiled_handlers.tasks.embedding import FLOAT_BYTES, EmbeddingTask

INPUT_TYPES = ("query", "document")


class MultiVectorTask(EmbeddingTask):
    """`{"inputs": "text", "input_type": "query"}` -> `{"embedding": [[...], ...]}` (a vector per token)."""

    NAME = "multi-vector"

    protocols = (
        KServeV2Protocol(),
        *rerank_routes("maxsim"),
        PlainProtocol(),
        EmbeddingsProtocol(),
        ModelsProtocol(),
        CohereEmbedProtocol(),
    )

    def keeps_token_states(self) -> bool:
        return True

    def read_settings(self, serving) -> None:
        settings = read_json(serving.model_dir / "config_sentence_transformers.json", {})
        self.colbert = ColbertSettings.read(settings, serving.tokenizer)
        self.projection = read_projection(serving.model_dir)  # read once: its size here, the module's weight below
        self.size = self.projection.shape[0]
        self.token_values = self.size
        # Cohere's `input_type` (search_query, search_document) finds these names (handlers/protocols/cohere.py)
        self.prompts = dict.fromkeys(INPUT_TYPES, "")
        self.default_prompt, self.dimension_sizes, self.ranges, self.normalize_default = None, None, None, True

    def param_checks(self) -> dict:
        checks = {**super().param_checks(), "input_type": choice_param(*INPUT_TYPES)}
        # prompt_name is how Cohere's input_type arrives; a text keeps its prefix, so only its end is cut
        for unserved in ("normalize", "truncation_direction"):
            del checks[unserved]
        return checks

    def precision_param(self, value: Any, name: str) -> str:
        if value != "float32":
            raise RequestError(400, f"parameter '{name}': multi-vector answers are float32 (float)", name)
        return value

    def tei_model_type(self) -> None:
        return None

    def max_seq_len(self, model_dir: Path, config) -> int | None:
        settings = read_json(model_dir / "config_sentence_transformers.json", {})
        return ColbertSettings.read(settings, None).document_length

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModel

        encoder = AutoModel.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return TokenVectors(encoder, self.projection, self.colbert.unattended_id)

    def check_request(self, request: Request) -> None:
        if request.params.get("truncation_direction", "right") != "right":  # Cohere's truncate: START
            raise RequestError(400, "'truncate': a text keeps its prefix, so only its END is cut (or NONE)", "truncate")
        if request.token_ids is not None:
            raise RequestError(400, "'input': a multi-vector model takes texts (it adds their prefix), not token ids")
        form = request.form
        if getattr(form, "encoding_format", None) == "base64" or "base64" in getattr(form, "embedding_types", ()):
            raise RequestError(400, "base64: multi-vector answers are lists of vectors, sent as floats")
        if request.scoring == "maxsim":
            if "input_type" in request.params or "prompt_name" in request.params:
                message = "leave out 'input_type': a rerank body's query and documents are embedded as what they are"
                raise RequestError(400, message, "input_type")
        elif self.input_type(request) is None:
            raise RequestError(
                400, "'input_type' is required: query or document (they embed differently)", "input_type"
            )

    @staticmethod
    def input_type(request: Request) -> str | None:
        return request.params.get("input_type", request.params.get("prompt_name"))

    def queries(self, request: Request) -> list[bool]:
        """Whether each text of the request is a query: a rerank body's first text, else as `input_type` says."""
        if request.scoring == "maxsim":
            return [index == 0 for index in range(len(request.texts))]
        return [self.input_type(request) == "query"] * len(request.texts)

    def model_texts(self, request: Request) -> list:
        prefixes = {True: self.colbert.query_prefix, False: self.colbert.document_prefix}
        return [prefixes[query] + text for query, text in zip(self.queries(request), request.texts, strict=True)]

    def model_ids(self, request: Request, tokenized: Tokenized) -> Tokenized:
        """Queries cut at the query length and expanded to it; documents as tokenized."""
        token_ids = [
            self.colbert.query_ids(ids) if query else ids
            for query, ids in zip(self.queries(request), tokenized.token_ids, strict=True)
        ]
        return Tokenized(tokenized.encodings, token_ids, tokenized.type_ids)

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        request = accepted.request
        kept = [
            row if query else row[self.colbert.kept_tokens(ids)]
            for query, row, ids in zip(self.queries(request), rows, accepted.token_ids, strict=True)
        ]
        if request.scoring == "maxsim":
            query, documents = kept[0], kept[1:]
            return [QueryVectors(len(query)), *(Score(maxsim(query, document)) for document in documents)]
        if request.protocol is not None:
            values = sum(row.numel() for row in kept)
            field = request.protocol.texts_field
            self.budget.check(values, FLOAT_BYTES, "values of token vectors", field, "send fewer or shorter texts")
        vectors = [np.ascontiguousarray(row.numpy(), dtype=np.float32) for row in kept]
        if isinstance(request.params.get("precision"), tuple):  # Cohere's embedding_types: float only
            return [Vectors({"float32": rows}) for rows in vectors]
        return [MultiVector(rows) for rows in vectors]
