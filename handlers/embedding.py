"""Sentence embeddings with the meaning of sentence-transformers' `encode` for the same model.

Pooling, normalization and the length limit are read from the model's own sentence-transformers
files (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`).
"""

from pathlib import Path

import torch

from handlers.base import CompiledHandler
from handlers.batch import Accepted
from handlers.config import HandlerConfig
from handlers.payload import boolean_param
from handlers.pooling import SentenceEmbedder, normalizes, pooling_modes, read_json


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

    def max_seq_len(self, model_dir: Path, config: HandlerConfig) -> int | None:
        return read_json(model_dir / "sentence_bert_config.json", {}).get("max_seq_length")

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        embeddings = torch.stack(rows)  # (texts, H)
        if accepted.request.params.get("normalize", self.normalize_default):
            embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
        return [{"embedding": embedding} for embedding in embeddings.tolist()]
