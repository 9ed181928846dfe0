"""Sentence embeddings with the meaning of sentence-transformers' `encode` for the same model.

Pooling, normalization and the length limit are read from the model's own sentence-transformers
files (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`).
"""

from pathlib import Path
from typing import Any

import torch

from handlers.base import CompiledHandler
from handlers.payload import Payload, boolean_param
from handlers.pooling import SentenceEmbedder, normalizes, pool_text, pooling_modes, read_json


class EmbeddingHandler(CompiledHandler):
    """`{"inputs": "text"}` -> `{"embedding": [...]}`; a list in gets a list out."""

    PARAMS = {"normalize": boolean_param}

    def read_task_settings(self, model_dir: Path, model_config) -> None:
        self.normalize_default = normalizes(model_dir)
        self.pooling = pooling_modes(model_dir)

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModel  # the model classes cost a worker that serves a package a second

        encoder = AutoModel.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return SentenceEmbedder(encoder, self.pooling)

    def from_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return pool_text(tokens, self.pooling)

    def max_seq_len(self, model_dir: Path) -> int | None:
        return read_json(model_dir / "sentence_bert_config.json", {}).get("max_seq_length")

    def encode(self, rows: list[torch.Tensor], body: Payload, encodings: list) -> Any:
        if body.params.get("normalize", self.normalize_default):
            rows = [torch.nn.functional.normalize(row, dim=-1) for row in rows]
        return body.shape_like_inputs([{"embedding": row.tolist()} for row in rows])
