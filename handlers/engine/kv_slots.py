"""A KV cache of slots for continuous batching: each running prompt owns a row and its own length.

transformers' StaticCache writes every row at one shared position, which is right for a group that
starts together; prompts that join and leave a running decode loop need a write position per row.
A slot row holds its prompt's keys and values from index 0, in order, as `generate()` would for the
prompt alone: the prompt at 0..P-1 (prefilled eagerly on the prompt alone and copied in), then one
token per step. The decode step writes every slot at its own position and lets each slot attend to
its indexes up to that position (an additive mask built in the graph), so its shapes (slots x 1)
never change whoever joins or leaves, and a free slot only computes a row nobody reads.
"""

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, StaticLayer

from ts_compiled_handlers.engine.decode_step import DecodeStep


class SlotLayer(StaticLayer):
    """One decoder layer's keys and values, (slots, kv heads, length, head dim), written per slot."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor):
        super().__init__(max_cache_len=keys.shape[2])
        self.keys, self.values, self.positions = keys, values, positions
        self.dtype, self.device = keys.dtype, keys.device
        self.batch_size, self.num_heads, _, self.k_head_dim = keys.shape
        self.v_head_dim = values.shape[-1]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write one token per slot at the slot's position; every slot's whole row is returned."""
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        self.keys[rows, :, self.positions] = key_states[:, :, 0]
        self.values[rows, :, self.positions] = value_states[:, :, 0]
        return self.keys, self.values


class SlotCache(Cache):
    """`slots` rows of `length` positions for every layer of `lm_config`; `positions` (slots,) is
    where each slot writes its next token (set before each step)."""

    def __init__(self, lm_config, slots: int, length: int, dtype: torch.dtype, device: torch.device):
        config = lm_config.get_text_config()
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        layers = []
        for _ in range(config.num_hidden_layers):
            keys = torch.zeros(slots, heads, length, head_dim, dtype=dtype, device=device)
            layers.append(SlotLayer(keys, torch.zeros_like(keys), self.positions))
        super().__init__(layers=layers)
        self.slots, self.length = slots, length
        for tensor in (self.positions, *(t for layer in layers for t in (layer.keys, layer.values))):
            torch._dynamo.mark_static_address(tensor)

    def fill(self, slot: int, prompt: DynamicCache, length: int) -> None:
        """Copy a prompt's prefilled keys and values into `slot` (indexes 0..length-1)."""
        for layer, source in zip(self.layers, prompt.layers, strict=True):
            layer.keys[slot, :, :length] = source.keys[0, :, :length]
            layer.values[slot, :, :length] = source.values[0, :, :length]


class SlotStep(DecodeStep):
    """One decode step over every slot: forward(input_ids (slots, 1), positions (slots,), cache) ->
    the next-token logits (slots, vocab). The cache's own `positions` must hold `positions`."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        dtype = self.lm.get_input_embeddings().weight.dtype
        indexes = torch.arange(cache.length, device=positions.device)
        visible = indexes[None, :] <= positions[:, None]  # (slots, length): the slot's own tokens so far
        mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
        mask = mask.masked_fill(~visible, torch.finfo(dtype).min)[:, None, None, :]
        return super().forward(input_ids, positions[:, None], mask, cache)

    def prefill(self, ids: list[int], cache: SlotCache, slot: int) -> torch.Tensor:
        """Run a prompt alone (eagerly: its length varies) into `slot`; its last position's logits."""
        device = cache.positions.device
        prompt = DynamicCache(config=self.lm.config)
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        output = self.lm(input_ids=input_ids, past_key_values=prompt, use_cache=True, logits_to_keep=1)
        cache.fill(slot, prompt, len(ids))
        return output.logits[0, -1]
