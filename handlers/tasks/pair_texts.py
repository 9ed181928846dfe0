"""A cross-encoder's (query, document) pairs as sentence-transformers' CrossEncoder hands them to the
model: its default prompt before the query, and, where the tokenizer's chat template can carry a
pair, each pair rendered as `query` and `document` messages (the prompt as a `system` one).

A template that cannot carry the pair (one written for user/assistant chats only) is not used: the
pair is tokenized as two texts, logged once at start (sentence-transformers refuses such a model).
"""

import logging
from pathlib import Path

from ts_compiled_handlers.graphs.model_files import read_json

logger = logging.getLogger(__name__)

PROBE = ("\u2983query\u2984", "\u2983document\u2984")  # markers no template writes itself
SIZE_KEYS = {"padding", "truncation", "max_length", "return_tensors", "restore_suffix"}


class PairTexts:
    """What the model reads for each pair: the pair itself, or its chat rendering (a single text)."""

    def __init__(self, model_dir: Path, tokenizer, prompts: dict[str, str], default_prompt: str | None):
        self.tokenizer = tokenizer
        self.prompt = prompts.get(default_prompt, "") if default_prompt else ""
        settings = read_json(model_dir / "sentence_bert_config.json", {})
        extra = (settings.get("processing_kwargs") or {}).get("chat_template") or {}
        self.template_kwargs = {key: value for key, value in extra.items() if key not in SIZE_KEYS}
        self.chat = getattr(tokenizer, "chat_template", None) is not None and self._template_carries_pairs()

    def _template_carries_pairs(self) -> bool:
        try:
            rendered = self._render(*PROBE)
        except Exception as error:  # a template may raise on roles it does not know (jinja's raise_exception)
            rendered = f"{type(error).__name__}: {error}"
        if all(marker in rendered for marker in PROBE):
            return True
        logger.warning("The chat template cannot carry query/document messages: pairs are tokenized as two texts")
        return False

    def _render(self, query: str, document: str) -> str:
        messages = [{"role": "query", "content": query}, {"role": "document", "content": document}]
        if self.prompt:
            messages.insert(0, {"role": "system", "content": self.prompt})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **self.template_kwargs)

    def __call__(self, pairs: list[tuple[str, str]]) -> list:
        if self.chat:
            return [self._render(query, document) for query, document in pairs]
        if self.prompt:
            return [(self.prompt + query, document) for query, document in pairs]
        return pairs
