"""LLM rerankers: a causal LM scoring a (query, document) pair by its next-token logits at the pair's
last token, as sentence-transformers' CrossEncoder scores one with its LogitScore module:
logit('yes') - logit('no') (or the 'yes' logit alone where the model names no 'no' token).

Only the last token's hidden state goes through the LM head, inside the graph: a call never makes
(texts x tokens x vocabulary) logits. The engine pads on the right, so the last real token is read
from the mask (or, over packed rows, from the segments); the model's causal attention makes its
state the one left padding would give.
"""

from pathlib import Path

import torch

from ts_compiled_handlers.engine.packing import attention_inputs, ends_of_texts, pick_per_text
from ts_compiled_handlers.graphs.model_files import module_folder, read_json

ANSWER_TOKENS = ("yes", "no")


def is_causal_lm(model_config) -> bool:
    return any(str(name).endswith("ForCausalLM") for name in getattr(model_config, "architectures", None) or [])


def score_token_ids(model_dir: Path, tokenizer) -> tuple[int, int | None]:
    """The (true, false) token ids: the model's LogitScore module's, else the tokenizer's 'yes' and
    'no' (which must be whole tokens of its vocabulary, not split or unknown)."""
    folder = module_folder(model_dir, "LogitScore")
    if folder is not None:
        config = read_json(folder / "config.json", {})
        if not isinstance(config.get("true_token_id"), int):
            raise ValueError(f"{folder.name}/config.json names no true_token_id")
        return config["true_token_id"], config.get("false_token_id")
    vocabulary = tokenizer.get_vocab()
    missing = [token for token in ANSWER_TOKENS if token not in vocabulary]
    if missing:
        raise ValueError(
            f"this causal LM's tokenizer has no token {' or '.join(map(repr, missing))}: an LLM reranker is "
            "scored by logit('yes') - logit('no'); save it with sentence-transformers' LogitScore to name others"
        )
    return vocabulary["yes"], vocabulary["no"]


class CausalLogitScore(torch.nn.Module):
    """forward(input_ids, attention_mask) -> (texts, 1) scores from a `*ForCausalLM`."""

    def __init__(self, causal_lm: torch.nn.Module, true_id: int, false_id: int | None):
        super().__init__()
        self.base = causal_lm.base_model
        self.head = causal_lm.get_output_embeddings()
        self.softcap = getattr(causal_lm.config, "final_logit_softcapping", None)  # Gemma 2's, on every logit
        self.true_id, self.false_id = true_id, false_id

    def _score(self, last: torch.Tensor) -> torch.Tensor:
        """(..., H) last-token states -> (..., 1) scores."""
        score = self._logit(last, self.true_id)
        if self.false_id is not None:
            score = score - self._logit(last, self.false_id)
        return score.unsqueeze(-1)

    def _logit(self, last: torch.Tensor, token: int) -> torch.Tensor:
        """One token's logit: one row of the head, not the vocabulary (packed rows have many slots)."""
        logit = (last.float() * self.head.weight[token].float()).sum(dim=-1)
        if self.head.bias is not None:
            logit = logit + self.head.bias[token].float()
        return torch.tanh(logit / self.softcap) * self.softcap if self.softcap else logit

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        last = (attention_mask.sum(dim=1) - 1).clamp(min=0)  # each right-padded row's last real token
        return self._score(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        """Each packed pair's score (rows, slots, 1), read at its own last token."""
        hidden = self.base(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.base, segments),
        )[0]
        return self._score(pick_per_text(hidden, segments, ends_of_texts(segments)))
