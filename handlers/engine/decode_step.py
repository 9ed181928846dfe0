"""One forward of a causal LM over a KV cache it updates, returning the last position's logits: the
step both decode loops compile (a static cache per batch, or slots that requests join and leave)."""

import torch


class DecodeStep(torch.nn.Module):
    """forward(input_ids, position_ids, attention_mask, cache) -> the next-token logits (rows, vocab)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, position_ids, attention_mask, cache) -> torch.Tensor:
        output = self.lm(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1]
