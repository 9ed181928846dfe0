"""Logits to labelled scores, with the rules of transformers' classification pipelines."""

import logging
from typing import Any

import torch

from ts_compiled_handlers.request.answers import Label
from ts_compiled_handlers.request.payload import RequestError

logger = logging.getLogger(__name__)

# How a row of logits becomes scores: the text-classification pipeline's choice per problem type.
SCORE_FUNCTIONS = {
    "softmax": lambda logits: torch.softmax(logits, dim=-1),
    "sigmoid": torch.sigmoid,
    "none": lambda logits: logits,
}


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
