"""Text generation's engine: a causal LM's prefill and its compiled decode step over a static KV cache.

The decoding counterpart of handlers/engine/engine.py, built by the same steps (handlers/startup/build_steps.py) and
immutable after: the step model (compiled, or eager for the checks), the plan, the dtype and the
caches. `run(token_ids)` is what warm-up and the checks run: a request is a decode loop, not one
pass, so per prompt it gives the prefill's logits and one greedy decode step's, joined. Requests run
`decoder(...)` (request batches, handlers/engine/static_decoding.py) or `prefill` and `decode` (continuous
batching, handlers/loops/decode_loop.py).
"""

import dataclasses

import torch

from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.engine.engine import OnModel, Outputs
from ts_compiled_handlers.engine.layout import Call, Layout
from ts_compiled_handlers.engine.runner import ModelRunner
from ts_compiled_handlers.engine.static_decoding import CachePool, GroupDecoder, left_pad


@dataclasses.dataclass(frozen=True)
class DecoderEngine(OnModel):
    model: ModelRunner  # of a DecodeStep (request batches) or a SlotStep (continuous batching)
    plan: buckets.BucketPlan
    dtype: torch.dtype
    device: torch.device
    pad_id: int
    caches: CachePool
    continuous: bool
    layout: Layout = Layout()  # prompts are never packed

    def run(self, token_ids: list[list[int]], one_per_row: bool = False, type_ids=None, adapters=None) -> Outputs:
        """Per prompt, the prefill's next-token logits and one greedy step's after it, joined.
        `adapters`: as `Engine.run`'s, always None here (generation serves no LoRA adapters)."""
        if adapters is not None:
            raise ValueError("text generation serves no adapters (handler.adapters)")
        lengths = [len(ids) for ids in token_ids]
        groups = buckets.generation_groups(lengths, self.plan)
        calls = [Call(group, tuple((index,) for index in group.indices)) for group in groups]
        if self.continuous:
            return Outputs(self._two_steps_in_slots(token_ids), lengths, calls)
        rows: list[torch.Tensor | None] = [None] * len(token_ids)
        with torch.inference_mode():
            for group in groups:
                decoder = self.decoder(group, [token_ids[i] for i in group.indices])
                first = decoder.prefill()
                second = decoder.step(first.argmax(dim=-1))
                joined = torch.cat([first, second], dim=-1).float().cpu()
                for row, index in enumerate(group.indices):
                    rows[index] = joined[row]
        return Outputs(rows, lengths, calls)

    def _two_steps_in_slots(self, token_ids: list[list[int]]) -> list[torch.Tensor]:
        """`run` through the slot cache: up to `slots` prompts prefilled, then one step over all."""
        slots = self.plan.max_batch
        rows = []
        with torch.inference_mode():
            for start in range(0, len(token_ids), slots):
                tokens = torch.full((slots,), self.pad_id, dtype=torch.long)
                positions = torch.zeros(slots, dtype=torch.long)
                first = []
                for slot, ids in enumerate(token_ids[start : start + slots]):
                    first.append(self.prefill(ids, slot))
                    tokens[slot], positions[slot] = first[-1].argmax(), len(ids)
                second = self.decode(tokens, positions)
                rows += [torch.cat([row, second[slot]]).float().cpu() for slot, row in enumerate(first)]
        return rows

    def decoder(self, group: buckets.Group, token_ids: list[list[int]]) -> GroupDecoder:
        """The prompts of one group, left-padded into the static cache of its batch bucket."""
        # Under inference mode, as warm-up made them: dynamo's guards tell inference tensors apart.
        with torch.inference_mode():
            cache = self.caches.get(group.batch_size)
            tensors = left_pad(token_ids, group.batch_size, group.seq_len, self.caches.cache_len, self.pad_id)
            return GroupDecoder(self.model, cache, *tensors, self.device)

    def prefill(self, ids: list[int], slot: int) -> torch.Tensor:
        """A prompt alone into `slot` of the slot cache (eagerly: its length varies); its next-token logits."""
        with torch.inference_mode():
            return self.model.eager.prefill(ids, self.caches.slots(), slot)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One compiled step over every slot: `tokens` (slots,) written at `positions` (slots,); logits
        (slots, vocab)."""
        cache = self.caches.slots()
        with torch.inference_mode():  # fresh tensors, made as warm-up made them: dynamo's guards see alike
            positions = positions.to(self.device, copy=True)
            cache.positions.copy_(positions)
            inputs = {"input_ids": tokens.view(-1, 1).to(self.device, copy=True), "positions": positions}
            return self.model({**inputs, "cache": cache})
