"""Token classification (NER) with the answers of transformers' `pipeline("token-classification")`."""

from pathlib import Path

import torch

from ts_compiled_handlers.graphs.logits import TokenLogits
from ts_compiled_handlers.request.payload import choice_param
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.entities import AGGREGATIONS, entities_for


class TokenClassificationTask(Task):
    """`{"inputs": "text", "aggregation_strategy": "simple"}` -> `[{"entity_group", "score", "word", ...}]`."""

    NAME = "token-classification"
    PARAMS = {"aggregation_strategy": choice_param(*AGGREGATIONS)}
    PER_TOKEN = True
    OFFSETS = True  # entities carry their start and end in the text
    LABELS = True

    def read_settings(self, serving) -> None:
        self.tokenizer = serving.tokenizer
        self.id2label = {int(index): label for index, label in serving.model_config.id2label.items()}
        self.token_values = len(self.id2label)  # a logit per label per token

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModelForTokenClassification

        model = AutoModelForTokenClassification.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return TokenLogits(model)

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        aggregation = accepted.request.params.get("aggregation_strategy", "none")
        texts = accepted.request.texts
        return [
            entities_for(row, encoding, text, self.tokenizer, self.id2label, aggregation)
            for row, encoding, text in zip(rows, accepted.encodings, texts, strict=True)
        ]
