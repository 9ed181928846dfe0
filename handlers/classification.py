"""Text classification with the answers of transformers' `pipeline("text-classification")`."""

from pathlib import Path

import torch

from handlers.base import CompiledHandler
from handlers.batch import Accepted
from handlers.labels import SCORE_FUNCTIONS, SequenceLogits, optional_top_k, score_function, top_labels


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

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        top_k = accepted.request.params.get("top_k", 1)
        return [top_labels(self.scores(row), self.id2label, top_k) for row in rows]
