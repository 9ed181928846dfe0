"""Sparse embeddings (SPLADE) with the meaning of sentence-transformers' `SparseEncoder.encode`.

The model is a masked LM saved as a SparseEncoder (a fill-mask Transformer and SpladePooling): one
vocabulary-sized vector per text, most of it zeros, answered as its non-zero entries in index order,
`{"indices": [...], "values": [...]}`. Per request: `top_k` keeps the k largest values (the model's
`max_active_dims` by default, as `encode` keeps them), `threshold` drops values at or below it (off
by default), and `prompt_name` as for dense embeddings. The pooling runs inside the compiled graph
in vocabulary slices (handlers/graphs/splade.py), so a call never holds every token's logits at once.
A request's entries are counted before they are listed: past the answer budget
(handlers/request/answer_budget.py) it gets 413 asking for `top_k` or `threshold`.
"""

from pathlib import Path
from typing import Any

import torch

from ts_compiled_handlers.graphs import splade
from ts_compiled_handlers.graphs.model_files import read_json
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.protocols.tei import ROUTES as TEI_ROUTES
from ts_compiled_handlers.protocols.tei import TeiEmbedSparseProtocol
from ts_compiled_handlers.request.answers import Sparse
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks.embedding import EmbeddingTask

# The fewest bytes an (index, value) entry takes in an answer, in practice: ~25 in ours (a 5-digit
# index, a float's 17 digits), ~45 in TEI's `{"index", "value"}`.
ENTRY_BYTES = 16


def top_k_param(value: Any, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise RequestError(400, f"parameter '{name}' must be an integer >= 1, or null for every non-zero value", name)
    return value


def threshold_param(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise RequestError(400, f"parameter '{name}' must be a number >= 0 (values at or below it are dropped)", name)
    return float(value)


def kept_count(row: torch.Tensor, top_k: int | None, threshold: float) -> int:
    """How many entries `sparse_entries` keeps of a vector, without listing them."""
    above = int((row > threshold).sum())
    return above if top_k is None else min(top_k, above)


def sparse_entries(row: torch.Tensor, top_k: int | None, threshold: float) -> tuple[list[int], list[float]]:
    """A vector's entries above `threshold` (the `top_k` largest of them), in index order."""
    indices = (row > threshold).nonzero().squeeze(1)
    values = row[indices]
    if top_k is not None and top_k < len(indices):
        kept = values.topk(top_k).indices.sort().values
        indices, values = indices[kept], values[kept]
    return indices.tolist(), values.tolist()


class SparseEmbeddingTask(EmbeddingTask):
    """`{"inputs": "text"}` -> `{"indices": [...], "values": [...]}`; a list in gets a list out."""

    NAME = "sparse-embedding"

    protocols = (KServeV2Protocol(), PlainProtocol(), TeiEmbedSparseProtocol(), *TEI_ROUTES)

    def keeps_token_states(self) -> bool:
        return False  # SPLADE pools a masked LM's logits inside its graph

    def read_settings(self, serving) -> None:
        model_dir, plan = serving.model_dir, serving.plan
        self.strategy, self.activation = splade.pooling_settings(model_dir)
        self.read_prompts(model_dir)
        self.max_active_dims = read_json(model_dir / "config_sentence_transformers.json", {}).get("max_active_dims")
        self.vocabulary = serving.model_config.vocab_size
        self.largest_call_tokens = max(plan.rows_for(seq_len) * seq_len for seq_len in plan.seq_lens)

    def param_checks(self) -> dict:
        checks = {**super().param_checks(), "top_k": top_k_param, "threshold": threshold_param}
        for dense_only in ("normalize", "dimensions", "precision"):
            del checks[dense_only]
        return checks

    def tei_model_type(self) -> dict:
        return {"embedding": {"pooling": "splade"}}

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModelForMaskedLM

        masked_lm = AutoModelForMaskedLM.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        slices = splade.slices_for(self.vocabulary, self.largest_call_tokens)
        return splade.SpladeEncoder(masked_lm, self.strategy, self.activation, slices)

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        params = accepted.request.params
        top_k, threshold = params.get("top_k", self.max_active_dims), params.get("threshold", 0.0)
        entries = sum(kept_count(row, top_k, threshold) for row in rows)
        remedy = "send top_k or threshold (or fewer texts)"
        if accepted.request.protocol is not None:  # answered as JSON (Ray Data's batches are arrays)
            self.budget.check(entries, ENTRY_BYTES, "non-zero values", "top_k", remedy)
        answers = []
        for row in rows:
            indices, values = sparse_entries(row, top_k, threshold)
            answers.append(Sparse(indices, values))
        return answers
