"""Prefill and decode over a static KV cache, so the compiled decode step sees one shape per batch bucket.

A group of prompts is left-padded to its prompt bucket P; the cache holds `cache_len` positions
(largest prompt bucket + max_new_tokens) and one attention mask of that full length is built once
per group: pads are 0, everything else 1, and the causal mask hides positions not yet written. So
every decode step of a batch bucket has the same shapes: input_ids (B, 1), position_ids (B, 1),
attention_mask (B, cache_len), and the cache's own fixed tensors. The prefill runs eagerly: it
initializes the cache lazily, which transformers says must not happen inside a compiled region.
"""

from typing import Callable

import torch
from transformers import StaticCache

from ts_compiled_handlers.engine.kv_slots import SlotCache


class CachePool:
    """The KV caches of one engine, made on first use and reused, so their addresses stay put (the
    compiled step's guards hold on to them): a static cache per batch rows for request batches, and
    the one slot cache of continuous batching (handlers/engine/kv_slots.py)."""

    def __init__(self, lm_config, cache_len: int, slots: int, dtype: torch.dtype, device: torch.device):
        self.lm_config = lm_config
        self.cache_len = cache_len
        self.slot_count, self.dtype, self.device = slots, dtype, device
        self.caches: dict[int, StaticCache] = {}
        self.slot_cache: SlotCache | None = None

    def get(self, rows: int) -> StaticCache:
        cache = self.caches.get(rows)
        if cache is None:
            cache = self.caches[rows] = StaticCache(config=self.lm_config, max_cache_len=self.cache_len)
        cache.reset()
        return cache

    def slots(self) -> SlotCache:
        if self.slot_cache is None:
            self.slot_cache = SlotCache(self.lm_config, self.slot_count, self.cache_len, self.dtype, self.device)
        return self.slot_cache


def left_pad(token_ids: list[list[int]], rows: int, prompt_len: int, cache_len: int, pad_id: int):
    """input_ids (rows, prompt_len), attention_mask (rows, cache_len), next position per row (rows,).

    Dummy rows (batch padding) hold pads that attend to themselves, so no row is fully masked.
    """
    input_ids = torch.full((rows, prompt_len), pad_id, dtype=torch.long)
    attention_mask = torch.ones((rows, cache_len), dtype=torch.long)
    lengths = torch.full((rows,), prompt_len, dtype=torch.long)
    for row, ids in enumerate(token_ids):
        pad = prompt_len - len(ids)
        input_ids[row, pad:] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, :pad] = 0
        lengths[row] = len(ids)
    return input_ids, attention_mask, lengths


class GroupDecoder:
    """The prompts of one group, generating together: `prefill()` once, then `step(tokens)` per token."""

    def __init__(self, model, cache, input_ids, attention_mask, lengths, device):
        """`model` is a CompiledModel of a DecodeStep: its eager module prefills, its compiled form steps."""
        self.model = model
        self.cache = cache
        self.input_ids = input_ids.to(device)
        self.attention_mask = attention_mask.to(device)
        self.next_positions = lengths.to(device)

    def prefill(self) -> torch.Tensor:
        prompt_len = self.input_ids.shape[1]
        positions = (self.attention_mask[:, :prompt_len].cumsum(dim=1) - 1).clamp(min=0)
        return self.model.eager(self.input_ids, positions, self.attention_mask, self.cache)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits after feeding one token per row (finished rows feed anything; it is ignored)."""
        inputs = {
            "input_ids": tokens.view(-1, 1).to(self.input_ids.device),
            "position_ids": self.next_positions.view(-1, 1),
            "attention_mask": self.attention_mask,
            "cache": self.cache,
        }
        logits = self.model(inputs)
        self.next_positions = self.next_positions + 1
        return logits


def generate(decoder: GroupDecoder, jobs: list, rows: int, pad_id: int, send: Callable[[list], None]) -> None:
    """Generate for the prompts of one group (`jobs`, handlers/tasks/continuation.py) until each is
    finished; `send(jobs)` after every token, for streaming."""
    with torch.inference_mode():
        logits = decoder.prefill().float().cpu()
        while True:
            tokens = torch.full((rows,), pad_id, dtype=torch.long)
            for row, job in enumerate(jobs):
                if not job.continuation.finished:
                    tokens[row] = job.sampler.choose(logits[row])
                    job.continuation.add(int(tokens[row]))
            send(jobs)
            if all(job.continuation.finished for job in jobs):
                return
            logits = decoder.step(tokens).float().cpu()
