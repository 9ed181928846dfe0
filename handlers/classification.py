"""Text classification with the answers of transformers' `pipeline("text-classification")`."""

from pathlib import Path
from typing import Any

import torch

from handlers.base import CompiledHandler
from handlers.labels import SCORE_FUNCTIONS, SequenceLogits, optional_top_k, score_function, top_labels
from handlers.payload import Payload


class ClassificationHandler(CompiledHandler):
    """`{"inputs": "text", "top_k": 1}` -> `[{"label": ..., "score": ...}]`; a list in gets a list of those."""

    PARAMS = {"top_k": optional_top_k}

    def read_task_settings(self, model_dir: Path, model_config) -> None:
        self.id2label = {int(index): label for index, label in model_config.id2label.items()}
        self.scores = SCORE_FUNCTIONS[score_function(model_config)]

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return SequenceLogits(model)

    def from_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[0]  # the head's answer at the text's first token

    def encode(self, rows: list[torch.Tensor], body: Payload, encodings: list) -> Any:
        top_k = body.params.get("top_k", 1)
        return body.shape_like_inputs([top_labels(self.scores(row), self.id2label, top_k) for row in rows])
