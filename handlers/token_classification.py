"""Token classification (NER) with the answers of transformers' `pipeline("token-classification")`."""

from pathlib import Path
from typing import Any

import torch

from handlers.base import CompiledHandler
from handlers.entities import AGGREGATIONS, entities_for
from handlers.labels import Logits
from handlers.payload import Payload, choice_param


class TokenClassificationHandler(CompiledHandler):
    """`{"inputs": "text", "aggregation_strategy": "simple"}` -> `[{"entity_group", "score", "word", ...}]`."""

    PARAMS = {"aggregation_strategy": choice_param(*AGGREGATIONS)}

    def read_task_settings(self, model_dir: Path, model_config) -> None:
        self.id2label = {int(index): label for index, label in model_config.id2label.items()}

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModelForTokenClassification

        model = AutoModelForTokenClassification.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return Logits(model)

    def from_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens

    def encode(self, rows: list[torch.Tensor], body: Payload, encodings: list) -> Any:
        aggregation = body.params.get("aggregation_strategy", "none")
        return body.shape_like_inputs(
            [
                entities_for(row, encoding, text, self.tokenizer, self.id2label, aggregation)
                for row, encoding, text in zip(rows, encodings, body.texts, strict=True)
            ]
        )
