"""Logits to labelled scores, with the rules of transformers' classification pipelines."""

import logging
from typing import Any

import torch

from ts_compiled_handlers.engine.packing import attention_inputs, pick_per_text, starts_of_texts
from ts_compiled_handlers.request.answers import Label
from ts_compiled_handlers.request.payload import RequestError

logger = logging.getLogger(__name__)

# How a row of logits becomes scores: the text-classification pipeline's choice per problem type.
SCORE_FUNCTIONS = {
    "softmax": lambda logits: torch.softmax(logits, dim=-1),
    "sigmoid": torch.sigmoid,
    "none": lambda logits: logits,
}


class Logits(torch.nn.Module):
    """A HF `...For<Task>` model reduced to its logits tensor, the shape torch.compile sees."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids=None) -> torch.Tensor:
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}  # (B, T): text pairs
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **types).logits


class TokenLogits(Logits):
    """A token classifier: per-token logits, packed rows included."""

    per_token = True

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        """Per-token logits (rows, T, labels) under a 4-D mask (packed rows)."""
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.model, segments),
        ).logits


class SequenceLogits(Logits):
    """A sequence classifier: `forward` as `Logits`; over packed rows its head runs on each text's
    first token, picked inside the graph, so a packed row answers for each of its texts."""

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        base, classifier = self.model.base_model, getattr(self.model, "classifier", None)
        pooler = getattr(base, "pooler", None)
        bert_like = (
            hasattr(pooler, "dense") and hasattr(pooler, "activation") and isinstance(classifier, torch.nn.Linear)
        )
        roberta_like = pooler is None and hasattr(classifier, "out_proj")  # its head reads token 0 itself
        if not (bert_like or roberta_like):  # DistilBERT, ALBERT, DeBERTa...: heads with other steps
            raise NotImplementedError(f"{type(self.model).__name__}'s head is neither BERT- nor RoBERTa-like")
        types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = base(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(base, segments),
            **types,
        )[0]
        firsts = pick_per_text(hidden, segments, starts_of_texts(segments))  # (rows, slots, H)
        rows, slots, width = firsts.shape
        firsts = firsts.reshape(rows * slots, 1, width)  # heads read token 0 of each (text, 1, H)
        if bert_like:  # the pooler (dense + tanh of token 0), then the classifier
            firsts = pooler(firsts)
        return classifier(firsts).reshape(rows, slots, -1)


def score_function(config) -> str:
    """softmax for single-label, sigmoid for multi-label or one label, none for regression."""
    if config.problem_type == "regression":
        return "none"
    if config.problem_type == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


# sentence-transformers' CrossEncoder activations a config may name (`sentence_transformers.activation_fn`).
CROSS_ENCODER_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "none",
    "torch.nn.Identity": "none",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.Tanh": "tanh",
}
SCORE_FUNCTIONS["tanh"] = torch.tanh


def cross_encoder_activation(config, saved: dict | None = None, labels: int | None = None) -> str:
    """What `CrossEncoder.predict` applies to the logits, decided as sentence-transformers decides:
    `config_sentence_transformers.json`'s `activation_fn` (`saved`), else `config.json`'s
    `sentence_transformers.activation_fn` (or its pre-v4 key), else sigmoid for one label and none
    for more (`labels` where the config's count is not the model's: an LLM reranker has one). Only
    `torch.` classes are trusted, as CrossEncoder trusts them without remote code; any other name
    is skipped, logged."""
    settings = getattr(config, "sentence_transformers", None) or {}
    for named in (
        (saved or {}).get("activation_fn"),
        settings.get("activation_fn"),
        getattr(config, "sbert_ce_default_activation_function", None),
    ):
        if named is None:
            continue
        if named in CROSS_ENCODER_ACTIVATIONS:
            return CROSS_ENCODER_ACTIVATIONS[named]
        if named.startswith("torch."):
            raise ValueError(
                f"the model names the cross-encoder activation {named!r}; served: {sorted(CROSS_ENCODER_ACTIVATIONS)}"
            )
        logger.warning("cross-encoder activation %r is not a torch class: skipped, as CrossEncoder skips it", named)
    return "sigmoid" if (config.num_labels if labels is None else labels) == 1 else "none"


def top_labels(scores: torch.Tensor, id2label: dict[int, str], top_k: int | None) -> list[Label]:
    """The labels by descending score, the first `top_k` of them (all for None)."""
    order = torch.argsort(scores, descending=True, stable=True).tolist()
    return [Label(id2label[index], scores[index].item()) for index in order[:top_k]]


def optional_top_k(value: Any, name: str) -> int | None:
    """A request's `top_k`: an integer >= 1, or null for every label."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"parameter '{name}' must be an integer >= 1, or null for all labels", name)
    return value
