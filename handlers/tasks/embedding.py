"""Sentence embeddings with the meaning of sentence-transformers' `encode` for the same model.

Pooling (mean, CLS, max, last token...), normalization, the length limit and the prompts are read
from the model's own sentence-transformers files (`modules.json`, `1_Pooling/config.json`,
`sentence_bert_config.json`, `config_sentence_transformers.json`), so an encoder (BERT, RoBERTa...)
and a decoder embedder (Qwen3-Embedding: last token, an instruction prompt) are served alike.
Per request: `normalize`, `prompt_name` (one of the model's prompts, else its default one), and
`dimensions` (the first N values, then normalized: Matryoshka models, see `embedding.dimensions`),
and `precision` (float32, int8, uint8, binary, ubinary: handlers/tasks/precisions.py).
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.graphs.model_files import named_prompts, read_json
from ts_compiled_handlers.graphs.pooling import (
    SentenceEmbedder,
    TokenStates,
    pooled_rows,
    pooling_modes,
    unit_rows,
)
from ts_compiled_handlers.graphs.sentence_head import read_head
from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.protocols.cohere import CohereEmbedProtocol
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.openai import EmbeddingsProtocol, ModelsProtocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.protocols.tei import ROUTES as TEI_ROUTES
from ts_compiled_handlers.protocols.tei import TeiEmbedAllProtocol, TeiEmbedProtocol
from ts_compiled_handlers.request.answers import HiddenStates, Vector, Vectors
from ts_compiled_handlers.request.payload import RequestError, boolean_param
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.precisions import INTEGER_BYTES, PRECISIONS, quantized, read_ranges, values_per_text

FLOAT_BYTES = 5  # the fewest bytes a value takes in an answer: base64's 16/3 (JSON's shortest float32s: ~12)


def precision_names(params: dict) -> tuple[str, ...]:
    """The precisions a request asked for: one name, or Cohere's several (a tuple)."""
    asked = params.get("precision", "float32")
    return asked if isinstance(asked, tuple) else (asked,)


class EmbeddingTask(Task):
    """`{"inputs": "text"}` -> `{"embedding": [...]}`; a list in gets a list out."""

    NAME = "embedding"
    ranges = None  # int8 and uint8 answers' AnswerRanges, read from the archive (None: built without)
    lower_case = False  # sentence_bert_config.json's do_lower_case (read_sentence_files)

    protocols = (
        KServeV2Protocol(),
        PlainProtocol(),
        EmbeddingsProtocol(),
        ModelsProtocol(),
        TeiEmbedProtocol(),
        TeiEmbedAllProtocol(),
        CohereEmbedProtocol(),
        *TEI_ROUTES,
    )

    def __init__(self, config: HandlerConfig, continuous: bool = False):
        super().__init__(config, continuous)
        self.PER_TOKEN = self.keeps_token_states()

    def keeps_token_states(self) -> bool:
        """The graph answers each token's state (TEI's `embed_all`), pooled after the call."""
        return self.config.embedding.embed_all

    def read_settings(self, serving) -> None:
        model_dir, model_config = serving.model_dir, serving.model_config
        self.read_sentence_files(model_dir)
        hidden = model_config.get_text_config().hidden_size
        self.size = self.head.size or hidden * len(self.pooling)
        self.token_values = hidden if self.PER_TOKEN else 0  # embed_all's rows: each token's state
        self.dimension_sizes = self._dimension_sizes(model_config)
        self.ranges = read_ranges(model_dir)

    def read_sentence_files(self, model_dir: Path) -> None:
        """The pooling, the modules after it (Dense, Normalize) and the prompts, as `encode` reads them."""
        self.pooling = pooling_modes(model_dir)
        self.head = read_head(model_dir)
        self.normalize_default = self.head.normalizes
        self.read_prompts(model_dir)
        # sentence-transformers lowercases what it tokenizes (the prompt too) where its config says so
        self.lower_case = bool(read_json(model_dir / "sentence_bert_config.json", {}).get("do_lower_case"))

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
            "precision": self.precision_param,
        }

    def precision_param(self, value: Any, name: str) -> str:
        """One of PRECISIONS that this archive can give (int8 and uint8 need its ranges)."""
        if value not in PRECISIONS:
            raise RequestError(400, f"parameter '{name}' must be one of: {', '.join(PRECISIONS)}", name)
        if value.endswith("int8") and self.ranges is None:
            message = f"parameter '{name}': {value} needs ranges this archive was built without; rebuild it"
            raise RequestError(400, message + " with `hfserve build` (docs/tasks.md#quantized-answers)", name)
        return value

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

    def check_request(self, request: Request) -> None:
        """embed_all where the archive keeps token states, as they are; int8 and uint8 fit the
        ranges' vectors only: full size, normalized as they were."""
        params = request.params
        if request.token_states:
            if not self.PER_TOKEN:
                keep = "build it with handler.embedding.embed_all: true"
                raise RequestError(400, f"embed_all: this archive does not keep token states; {keep}")
            for name in ("normalize", "dimensions", "precision"):
                if name in params:
                    raise RequestError(400, f"embed_all answers each token's state as it is: leave out '{name}'", name)
        if not any(name.endswith("int8") for name in precision_names(params)):
            return
        if "dimensions" in params:
            raise RequestError(400, "int8 and uint8 answers are full size: leave out 'dimensions'", "dimensions")
        if params.get("normalize", self.normalize_default) != self.ranges.normalized:
            wanted = "true" if self.ranges.normalized else "false"
            raise RequestError(400, f"int8 and uint8 answers' ranges are for 'normalize': {wanted}", "normalize")

    def tei_model_type(self) -> dict:
        return {"embedding": {"pooling": "+".join(self.pooling)}}

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModel  # the model classes cost a worker that serves a package a second

        encoder = AutoModel.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        if self.PER_TOKEN:
            return TokenStates(encoder)
        return SentenceEmbedder(encoder, self.pooling, read_head(model_dir).layers)  # its own: cast with the model

    def max_seq_len(self, model_dir: Path, config: HandlerConfig) -> int | None:
        return read_json(model_dir / "sentence_bert_config.json", {}).get("max_seq_length")

    def model_texts(self, request: Request) -> list:
        """Each text after the request's prompt (or the model's default prompt), as `encode` reads it."""
        prompt = self.prompts.get(request.params.get("prompt_name", self.default_prompt), "")
        texts = [prompt + text for text in request.texts] if prompt else request.texts
        return [text.lower() for text in texts] if self.lower_case else texts

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        """In numpy: after the model call every small op runs on cold caches, and torch's each go
        through its dispatcher (docs/performance.md, "Where a request's CPU goes"). `precision`
        is one name, or a tuple of them (Cohere's `embedding_types`: an answer per precision)."""
        params = accepted.request.params
        if self.PER_TOKEN:
            if accepted.request.token_states:
                return self.token_states(accepted, rows)
            rows = pooled_rows(rows, self.pooling, self.head.layers)
        precisions, names = params.get("precision", "float32"), precision_names(params)
        if accepted.request.protocol is not None:  # answered as JSON (Ray Data's batches are arrays)
            self._check_size(len(rows), params.get("dimensions", rows[0].shape[-1]), names, accepted)
        embeddings = np.stack([row.numpy() for row in rows])  # (texts, H) float32
        if "dimensions" in params:
            embeddings = embeddings[:, : params["dimensions"]]
        if params.get("normalize", self.normalize_default):  # as torch.nn.functional.normalize
            embeddings = unit_rows(embeddings)
        # float32 rows, C-contiguous, as runtime/json_text.py's `as_json` writes them shortest
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        if not isinstance(precisions, tuple):
            vectors = embeddings if precisions == "float32" else quantized(embeddings, precisions, self.ranges)
            return [Vector(vector) for vector in vectors]
        by_precision = {name: quantized(embeddings, name, self.ranges) for name in names}
        return [Vectors({name: values[text] for name, values in by_precision.items()}) for text in range(len(rows))]

    def token_states(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        """Each text's tokens' states (T, H) float32, within the answer budget."""
        if accepted.request.protocol is not None:
            values = sum(row.numel() for row in rows)
            field = accepted.request.protocol.texts_field
            self.budget.check(values, FLOAT_BYTES, "values of token states", field, "send fewer or shorter texts")
        return [HiddenStates(np.ascontiguousarray(row.numpy(), dtype=np.float32)) for row in rows]

    def _check_size(self, texts: int, dimensions: int, precisions: tuple, accepted: Accepted) -> None:
        """The answer budget's check before the answer is made: a float takes FLOAT_BYTES, a byte INTEGER_BYTES."""
        values = sum(values_per_text(dimensions, name) for name in precisions)
        least = sum(
            values_per_text(dimensions, name) * (FLOAT_BYTES if name == "float32" else INTEGER_BYTES)
            for name in precisions
        )
        field = accepted.request.protocol.texts_field
        self.budget.check(texts, least, f"embeddings ({values} values each)", field, "send fewer texts")
