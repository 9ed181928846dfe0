"""Text classification with the answers of transformers' `pipeline("text-classification")`; text pairs
and reranking with those of sentence-transformers' `CrossEncoder`.

A text pair (`{"text": q, "text_pair": p}`) is one input of the model, its two texts told apart by
token types where the model has them (BERT); packed rows carry them too. The rerank form
(handlers/protocols/rerank.py) scores a query against each document with the activation
`CrossEncoder.predict` applies, and answers best first.
"""

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ts_compiled_handlers.engine.engine import Engine
from ts_compiled_handlers.engine.layout import Layout
from ts_compiled_handlers.engine.runner import ModelRunner
from ts_compiled_handlers.graphs import logit_score
from ts_compiled_handlers.graphs.logits import SequenceLogits
from ts_compiled_handlers.graphs.model_files import named_prompts, read_json
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.protocols.rerank_routes import rerank_routes
from ts_compiled_handlers.protocols.tei import ROUTES as TEI_ROUTES
from ts_compiled_handlers.protocols.tei import TeiPredictProtocol
from ts_compiled_handlers.request.answers import Score
from ts_compiled_handlers.request.payload import RequestError, boolean_param
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.labels import (
    SCORE_FUNCTIONS,
    cross_encoder_activation,
    optional_top_k,
    score_function,
    top_labels,
)
from ts_compiled_handlers.tasks.pair_texts import PairTexts

if TYPE_CHECKING:  # the startup room builds what a task reads; a task only reads it
    from ts_compiled_handlers.startup.serving import Serving


class ClassificationTask(Task):
    """`{"inputs": "text", "top_k": 1}` -> `[{"label": ..., "score": ...}]`; a list in gets a list of those."""

    NAME = "text-classification"
    PARAMS = {"top_k": optional_top_k, "raw_scores": boolean_param}  # raw_scores: the logits, as TEI's
    PAIRS = True
    LABELS = True
    protocols = (
        KServeV2Protocol(),
        *rerank_routes(),
        PlainProtocol(),
        TeiPredictProtocol(),
        *TEI_ROUTES,
    )

    def read_settings(self, serving: "Serving") -> None:
        model_dir, model_config = serving.model_dir, serving.model_config
        self.causal = logit_score.is_causal_lm(model_config)  # an LLM reranker (handlers/graphs/logit_score.py)
        if self.causal:
            self.score_ids = logit_score.score_token_ids(model_dir, serving.tokenizer)
            self.id2label = {0: "LABEL_0"}  # one score, as CrossEncoder has one label over LogitScore
        else:
            self.id2label = {int(index): label for index, label in model_config.id2label.items()}
        labels = len(self.id2label)
        self.scores = SCORE_FUNCTIONS["sigmoid" if self.causal else score_function(model_config)]
        # sentence-transformers reads its own file only in a folder it saved (one with modules.json)
        saved_by_st = (model_dir / "modules.json").is_file()
        saved = read_json(model_dir / "config_sentence_transformers.json", {}) if saved_by_st else {}
        self.rerank_scores = SCORE_FUNCTIONS[cross_encoder_activation(model_config, saved, labels)]
        self.token_types = (getattr(model_config, "type_vocab_size", 0) or 0) > 1  # BERT's segment A / B
        self.prompts = named_prompts(saved)
        self.pair_texts = PairTexts(model_dir, serving.tokenizer, self.prompts, saved.get("default_prompt_name"))

    def tokenizer_options(self) -> dict:
        """A pair rendered by a chat template is one text whose end (where the score is read) a cut
        would drop: it is tokenized as rendered, never truncated."""
        return {"special_tokens": False, "truncates": False} if self.pair_texts.chat else {}

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        load = {"dtype": torch.float32, "use_safetensors": True, "trust_remote_code": False}
        if self.causal:
            causal_lm = AutoModelForCausalLM.from_pretrained(model_dir, **load)
            return logit_score.CausalLogitScore(causal_lm, *self.score_ids)
        return SequenceLogits(AutoModelForSequenceClassification.from_pretrained(model_dir, **load))

    def model_texts(self, request) -> list:
        """Pairs as CrossEncoder reads them (its prompt, its chat template); single texts as sent."""
        texts = request.texts
        return self.pair_texts(texts) if texts and isinstance(texts[0], tuple) else texts

    def calibration_inputs(self, texts: list[str], pairs) -> list:
        """A reranker (one label) is calibrated on pairs, as it serves; a classifier on single texts."""
        return self.pair_texts(pairs()) if len(self.id2label) == 1 else texts

    def engine(self, model: ModelRunner, serving: "Serving", dtype: torch.dtype, layout: Layout) -> Engine:
        token_types = self.token_types and not self.pair_texts.chat  # a rendered pair is one text
        return super().engine(model, serving, dtype, dataclasses.replace(layout, token_types=token_types))

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        request = accepted.request
        if request.scoring == "rerank":
            if len(self.id2label) != 1:
                raise RequestError(400, f"reranking needs a one-label cross-encoder; this one has {len(self.id2label)}")
            scores = (lambda row: row.float()) if request.params.get("raw_scores") else self.rerank_scores
            return [Score(scores(row)[0].item()) for row in rows]
        top_k = request.params.get("top_k", 1)
        scores = (lambda row: row.float()) if request.params.get("raw_scores") else self.scores
        return [top_labels(scores(row), self.id2label, top_k) for row in rows]

    def tei_model_type(self) -> dict:
        labels = {"id2label": {str(index): label for index, label in self.id2label.items()}}
        labels["label2id"] = {label: index for index, label in self.id2label.items()}
        return {"reranker" if len(self.id2label) == 1 else "classifier": labels}
