"""Packing: a batch's texts laid end to end in rows of at most a token budget, kept apart by the mask.

Length groups pad every text to its bucket and cost one model call per bucket; packing pads only
the tail of each row. A packed row holds several texts, each with position ids from the model's
first position and a segment id of its own; the model builds a block-diagonal additive mask from
the segment ids inside the graph, so no text sees another, and the tail padding gets a segment of
its own (no fully masked row). Outputs come back per token and are cut per text.

Rows are then grouped and padded like texts: `buckets.group_requests` over the row lengths, so
packed shapes stay in the plan's (batch, seq_len) grid and every compiled graph serves them. The
compiled module's inputs are (rows, seq_len) tensors only: how many texts share a row never
becomes a dimension to compile.
"""

import dataclasses

import torch

from handlers import buckets

# The budget of `pack_tokens: auto` (capped at the largest length bucket): longer rows kept paying
# up to MiniLM's limit of 256 (docs/performance.md, "Packing"); longer ones were not measured.
AUTO_BUDGET = 256
PAD_SEGMENT = 0  # the segment of a row's tail padding (and of a static batch's dummy rows)


@dataclasses.dataclass(frozen=True)
class Span:
    """Where one text sits in a group's output: its row, first token and length."""

    text: int
    row: int
    start: int
    length: int


def pack_rows(lengths: list[int], budget: int) -> list[list[int]]:
    """Texts (by index) in rows of at most `budget` tokens: first fit, longest first.

    A text longer than the budget gets a row of its own.
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = next((row for row, free in enumerate(room) if free >= lengths[index]), None)
        if slot is None:
            rows.append([index])
            room.append(budget - lengths[index])
        else:
            rows[slot].append(index)
            room[slot] -= lengths[index]
    return rows


def pad_packs(
    token_ids: list[list[int]], rows: list[list[int]], group: buckets.Group, pad_id: int, first_position: int
) -> tuple[dict[str, torch.Tensor], list[Span]]:
    """input_ids, position_ids and segments of shape (batch_size, seq_len) for the group's rows
    (`group.indices` index `rows`), and where each text landed."""
    shape = (group.batch_size, group.seq_len)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    position_ids = torch.full(shape, first_position, dtype=torch.long)
    segments = torch.full(shape, PAD_SEGMENT, dtype=torch.long)
    spans = []
    for row, pack in enumerate(group.indices):
        start = 0
        for segment, text in enumerate(rows[pack], start=PAD_SEGMENT + 1):
            ids = token_ids[text]
            end = start + len(ids)
            input_ids[row, start:end] = torch.tensor(ids, dtype=torch.long)
            position_ids[row, start:end] = torch.arange(first_position, first_position + len(ids))
            segments[row, start:end] = segment
            spans.append(Span(text, row, start, len(ids)))
            start = end
    return {"input_ids": input_ids, "position_ids": position_ids, "segments": segments}, spans


def block_mask(segments: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive (rows, 1, seq, seq) mask in which a token sees only its own segment.

    Additive, not boolean: a boolean 4-D mask is right under SDPA but would be added as 0/1 by
    transformers' eager attention.
    """
    same = segments[:, :, None] == segments[:, None, :]
    blocked = torch.zeros(same.shape, dtype=dtype, device=segments.device)
    return blocked.masked_fill(~same, torch.finfo(dtype).min)[:, None]


class PackedModel(torch.nn.Module):
    """A task module run over packed rows: forward(input_ids, position_ids, segments) -> its
    per-token outputs (rows, seq_len, ...), from the module's `tokens(input_ids, attention_mask,
    position_ids)`."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        dtype = next(self.module.parameters()).dtype
        return self.module.tokens(input_ids, block_mask(segments, dtype), position_ids)


def first_position(module: torch.nn.Module) -> int:
    """The position id of a text's first token: 0, or past the padding index for models that
    count positions from there (RoBERTa, XLM-R: their embeddings keep a `padding_idx`)."""
    for part in module.modules():
        if hasattr(part, "position_embeddings") and getattr(part, "padding_idx", None) is not None:
            return part.padding_idx + 1
    return 0
