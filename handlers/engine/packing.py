"""Packing: a batch's texts laid end to end in rows of at most a token budget, kept apart by the mask.

Length groups pad every text to its bucket and cost one model call per bucket; packing pads only
the tail of each row. A packed row holds several texts, each with position ids from the model's
first position and a segment id of its own; the model builds a block-diagonal additive mask from
the segment ids inside the graph, so no text sees another, and the tail padding gets a segment of
its own (no fully masked row).

Rows are then grouped and padded like texts (handlers/engine/layout.py), so packed shapes stay in the
plan's (batch, seq_len) grid and every compiled graph serves them. The compiled module's inputs
are (rows, seq_len) tensors only: how many texts share a row never becomes a dimension to compile.
Its output is per text, pooled inside the graph: a row of T tokens has `text_slots(T)` = ceil(T/4)
slots, text k of the row filling slot k-1 (the packer never puts more texts in a row), so only
(rows, slots, ...) leaves the graph, not every token's hidden state. Per-token tasks (token
classification) keep their per-token outputs.
"""

import torch

from ts_compiled_handlers.engine import buckets, local_attention, text_attention

# The budget of `pack_tokens: auto` (capped at the largest length bucket): longer rows kept paying
# up to MiniLM's limit of 256 (docs/performance.md, "Packing"); longer ones were not measured.
AUTO_BUDGET = 256
PAD_SEGMENT = 0  # the segment of a row's tail padding (and of a static batch's dummy rows)
TOKENS_PER_SLOT = 4  # a row of T tokens holds at most ceil(T / 4) texts (see the module docstring)


def text_slots(seq_len: int) -> int:
    """Texts a packed row of `seq_len` tokens may hold: its output slots. Shapes may be symbolic."""
    return (seq_len + TOKENS_PER_SLOT - 1) // TOKENS_PER_SLOT


def pack_rows(lengths: list[int], budget: int, seq_lens: tuple[int, ...]) -> list[list[int]]:
    """Texts (by index) in rows of at most `budget` tokens: first fit, longest first.

    A text longer than the budget gets a row of its own; a row takes no more texts than the slots
    of the length bucket it will be padded to (`seq_lens`).
    """
    rows: list[list[int]] = []
    used: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        length = lengths[index]
        slot = next(
            (row for row, tokens in enumerate(used) if _fits(tokens + length, len(rows[row]) + 1, budget, seq_lens)),
            None,
        )
        if slot is None:
            rows.append([index])
            used.append(length)
        else:
            rows[slot].append(index)
            used[slot] += length
    return rows


def _fits(tokens: int, texts: int, budget: int, seq_lens: tuple[int, ...]) -> bool:
    bucket = buckets.seq_bucket(tokens, seq_lens)
    return tokens <= budget and bucket is not None and texts <= text_slots(bucket)


def block_mask(segments: torch.Tensor, dtype: torch.dtype, causal: bool = False, window: int = 0) -> torch.Tensor:
    """The additive (rows, 1, seq, seq) mask in which a token sees only its own segment (and, for a
    causal model, only the tokens before it there; with `window`, only those fewer than `window`
    positions away: a sliding-window layer's).

    Additive, not boolean: a boolean 4-D mask is right under SDPA but would be added as 0/1 by
    transformers' eager attention. A model given a 4-D mask uses it as it is, so a decoder's
    causality must be in it.
    """
    visible = segments[:, :, None] == segments[:, None, :]  # (rows, query, key)
    if causal or window:  # every operand (rows, ...): a broadcast over a size-1 batch would specialize the graph
        order = torch.arange(segments.shape[1], device=segments.device).expand_as(segments)
        ahead = order[:, :, None] - order[:, None, :]
        if causal:
            visible = visible & (ahead >= 0)
        if window:
            visible = visible & (ahead.abs() < window)
    blocked = torch.zeros(visible.shape, dtype=dtype, device=segments.device)
    return blocked.masked_fill(~visible, torch.finfo(dtype).min)[:, None]


def sliding_window(module: torch.nn.Module) -> int:
    """How near a key must be for the model's sliding-window layers (fewer positions away than this,
    as each such layer tells its attention: Gemma 3's window, ModernBERT's half window + 1); 0
    without such layers. Given one 4-D mask, those layers would take it whole, window and all lost,
    so their packed rows get a mask of their own (`PackedModel`)."""
    if not any(local_attention.configured(part.config) for part in local_attention.transformers_models(module)):
        return 0
    windows = {getattr(part, "sliding_window", None) for part in module.modules()}
    windows = {window for window in windows if isinstance(window, int) and not isinstance(window, bool) and window > 0}
    return min(windows, default=0)


def attends_causally(module: torch.nn.Module) -> bool:
    """Whether the model's attention is causal (a decoder: Qwen, Llama...), as its attention layers say."""
    return any(getattr(part, "is_causal", False) is True for part in module.modules())


def slot_index(segments: torch.Tensor) -> torch.Tensor:
    """(rows * seq_len,) the output slot of each token's text (row * slots + segment - 1); padding
    goes to one spare slot past the end."""
    rows, seq_len = segments.shape
    slots = text_slots(seq_len)
    index = torch.arange(rows, device=segments.device)[:, None] * slots + segments - 1
    return torch.where(segments > PAD_SEGMENT, index, rows * slots).flatten()


def _into_slots(values: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """The sum of each text's token values (rows, T, H) in its slot: (rows, slots, H)."""
    rows, seq_len, width = values.shape
    slots = text_slots(seq_len)
    sums = values.new_zeros(rows * slots + 1, width).index_add(0, slot_index(segments), values.flatten(0, 1))
    return sums[:-1].view(rows, slots, width)


def sum_per_text(values: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """The sum of each packed text's token values (rows, T, H): (rows, slots, H)."""
    return _into_slots(values, segments)


def starts_of_texts(segments: torch.Tensor) -> torch.Tensor:
    """(rows, T) true at each text's first token."""
    before = torch.nn.functional.pad(segments[:, :-1], (1, 0), value=-1)  # each token's left neighbour
    return (segments != before) & (segments > PAD_SEGMENT)


def ends_of_texts(segments: torch.Tensor) -> torch.Tensor:
    """(rows, T) true at each text's last token."""
    after = torch.nn.functional.pad(segments[:, 1:], (0, 1), value=-1)  # each token's right neighbour
    return (segments != after) & (segments > PAD_SEGMENT)


def pick_per_text(values: torch.Tensor, segments: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """The value (rows, T, H) at the one token per text where `picked` (rows, T) is true: (rows, slots, H)."""
    return _into_slots(values * picked[..., None].to(values.dtype), segments)


def pool_per_text(hidden: torch.Tensor, segments: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """sentence-transformers' poolings of each packed text's own tokens, in float32: (rows, slots, H * modes)."""
    hidden = hidden.float()  # (rows, T, H)
    rows, seq_len, width = hidden.shape
    slots = text_slots(seq_len)
    index = slot_index(segments)
    ones = hidden.new_ones(rows * seq_len, 1)
    counts = hidden.new_zeros(rows * slots + 1, 1).index_add(0, index, ones)[:-1].view(rows, slots, 1)
    counts = counts.clamp(min=1)

    def largest() -> torch.Tensor:
        floor = hidden.new_full((rows * slots + 1, width), float("-inf"))
        spread = index[:, None].expand(-1, width)
        return floor.scatter_reduce(0, spread, hidden.flatten(0, 1), "amax")[:-1].view(rows, slots, width)

    pooled = {
        "cls": lambda: pick_per_text(hidden, segments, starts_of_texts(segments)),
        "lasttoken": lambda: pick_per_text(hidden, segments, ends_of_texts(segments)),
        "max": largest,
        "mean": lambda: _into_slots(hidden, segments) / counts,
        "mean_sqrt_len_tokens": lambda: _into_slots(hidden, segments) / counts.sqrt(),
    }
    return torch.cat([pooled[mode]() for mode in modes], dim=-1)


class PackedModel(torch.nn.Module):
    """A task module run over packed rows: forward(input_ids, position_ids, segments[, token_type_ids])
    -> its `packed(input_ids, mask, position_ids, segments, token_type_ids)`: per text (rows, slots, ...)
    or, for a per-token task, per token (rows, seq_len, ...)."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        self.causal = attends_causally(module)
        self.window = sliding_window(module)

    def forward(self, input_ids, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        dtype = next(self.module.parameters()).dtype
        mask = block_mask(segments, dtype, self.causal)
        if self.window:  # transformers' masks by layer type: the sliding layers' keeps their band
            sliding = block_mask(segments, dtype, self.causal, self.window)
            mask = {"full_attention": mask, "sliding_attention": sliding}
        return self.module.packed(input_ids, mask, position_ids, segments, token_type_ids)


def first_position(module: torch.nn.Module) -> int:
    """The position id of a text's first token: 0, or past the padding index for models that
    count positions from there (RoBERTa, XLM-R: their embeddings keep a `padding_idx`)."""
    for part in module.modules():
        if hasattr(part, "position_embeddings") and getattr(part, "padding_idx", None) is not None:
            return part.padding_idx + 1
    return 0


def attention_inputs(model: torch.nn.Module, segments: torch.Tensor) -> dict:
    """What a packed call passes down to the model's attention: the rows' segments, where its
    attention runs per text (handlers/engine/text_attention.py); nothing otherwise."""
    return {text_attention.SEGMENTS_KWARG: segments} if text_attention.is_enabled(model) else {}
