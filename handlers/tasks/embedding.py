"""Sentence embeddings with the meaning of sentence-transformers' `encode` for the same model.

Pooling (mean, CLS, max, last token...), normalization, the length limit and the prompts are read
from the model's own sentence-transformers files (`modules.json`, `1_Pooling/config.json`,
`sentence_bert_config.json`, `config_sentence_transformers.json`), so an encoder (BERT, RoBERTa...)
and a decoder embedder (Qwen3-Embedding: last token, an instruction prompt) are served alike.
Per request: `normalize`, `prompt_name` (one of the model's prompts, else its default one), and
`dimensions` (the first N values, then normalized: Matryoshka models, see `embedding.dimensions`).
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.openai import EmbeddingsProtocol, ModelsProtocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.protocols.tei import ROUTES as TEI_ROUTES
from ts_compiled_handlers.protocols.tei import TeiEmbedProtocol
from ts_compiled_handlers.request.payload import RequestError, boolean_param
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.model_files import named_prompts, read_json
from ts_compiled_handlers.tasks.pooling import SentenceEmbedder, normalizes, pooling_modes

if TYPE_CHECKING:  # the startup room builds what a task reads; a task only reads it
    from ts_compiled_handlers.startup.config import HandlerConfig


NORM_EPS = 1e-12  # torch.nn.functional.normalize's floor on a vector's norm
FLOAT_BYTES = 5  # the fewest bytes a value takes in an answer: base64's 16/3 (JSON's shortest float32s: ~12)


class EmbeddingTask(Task):
    """`{"inputs": "text"}` -> `{"embedding": [...]}`; a list in gets a list out."""

    NAME = "embedding"

    protocols = (
        KServeV2Protocol(),
        PlainProtocol(),
        EmbeddingsProtocol(),
        ModelsProtocol(),
        TeiEmbedProtocol(),
        *TEI_ROUTES,
    )

    def read_settings(self, serving) -> None:
        model_dir, model_config = serving.model_dir, serving.model_config
        self.normalize_default = normalizes(model_dir)
        self.pooling = pooling_modes(model_dir)
        self.read_prompts(model_dir)
        self.size = model_config.get_text_config().hidden_size * len(self.pooling)
        self.dimension_sizes = self._dimension_sizes(model_config)

    def read_prompts(self, model_dir: Path) -> None:
        """The model's named prompts and its default one (config_sentence_transformers.json)."""
        settings = read_json(model_dir / "config_sentence_transformers.json", {})
        self.prompts = named_prompts(settings)
        self.default_prompt = settings.get("default_prompt_name")
        if self.default_prompt is not None and self.default_prompt not in self.prompts:
            raise ValueError(f"config_sentence_transformers.json: no prompt named {self.default_prompt!r}, the default")

    def _dimension_sizes(self, model_config) -> set[int] | None:
        """The `dimensions` a request may ask for: None where none, else the sizes (all up to `size`)."""
        trained = getattr(model_config, "matryoshka_dimensions", None)
        if trained:
            return {int(size) for size in trained if 0 < int(size) <= self.size}
        if getattr(model_config, "is_matryoshka", False) or self.config.embedding.dimensions == "any":
            return set(range(1, self.size + 1))
        return None

    def param_checks(self) -> dict:
        return {
            **super().param_checks(),
            "normalize": boolean_param,
            "prompt_name": self._prompt_param,
            "dimensions": self._dimensions_param,
        }

    def _prompt_param(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or value not in self.prompts:  # a list or object is no name (nor hashable)
            names = ", ".join(sorted(self.prompts)) or "none (this model has no prompts)"
            raise RequestError(400, f"parameter '{name}' must name one of the model's prompts: {names}", name)
        return value

    def _dimensions_param(self, value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= self.size:
            raise RequestError(
                400, f"parameter '{name}' must be an integer from 1 to {self.size}, the model's size", name
            )
        if self.dimension_sizes is None:
            raise RequestError(
                400,
                f"parameter '{name}': this model was not trained for shorter embeddings (Matryoshka); "
                "the archive allows them with handler.embedding.dimensions: any",
                name,
            )
        if value not in self.dimension_sizes:
            raise RequestError(400, f"parameter '{name}' must be one of {sorted(self.dimension_sizes)}", name)
        return value

    def tei_model_type(self) -> dict:
        return {"embedding": {"pooling": "+".join(self.pooling)}}

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModel  # the model classes cost a worker that serves a package a second

        encoder = AutoModel.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return SentenceEmbedder(encoder, self.pooling)

    def max_seq_len(self, model_dir: Path, config: "HandlerConfig") -> int | None:
        return read_json(model_dir / "sentence_bert_config.json", {}).get("max_seq_length")

    def model_texts(self, request: Request) -> list:
        """Each text after the request's prompt (or the model's default prompt), as `encode` reads it."""
        prompt = self.prompts.get(request.params.get("prompt_name", self.default_prompt), "")
        return [prompt + text for text in request.texts] if prompt else request.texts

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        """In numpy: after the model call every small op runs on cold caches, and torch's each go
        through its dispatcher (docs/performance.md, "Where a request's CPU goes")."""
        params = accepted.request.params
        values = len(rows) * params.get("dimensions", rows[0].shape[-1])
        if accepted.request.protocol is not None:  # answered as JSON (Ray Data's batches are arrays)
            field = accepted.request.protocol.texts_field
            self.budget.check(values, FLOAT_BYTES, "values", field, "send fewer texts")
        embeddings = np.stack([row.numpy() for row in rows])  # (texts, H) float32
        if "dimensions" in params:
            embeddings = embeddings[:, : params["dimensions"]]
        if params.get("normalize", self.normalize_default):  # as torch.nn.functional.normalize
            embeddings = embeddings / np.maximum(np.linalg.norm(embeddings, axis=-1, keepdims=True), NORM_EPS)
        # float32 rows, C-contiguous, as runtime/json_text.py's `as_json` writes them shortest
        return [{"embedding": embedding} for embedding in np.ascontiguousarray(embeddings, dtype=np.float32)]
