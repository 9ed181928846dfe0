"""How a batch's tokenized texts become model calls, and how the calls' outputs become one row per text.

Two layouts, chosen once when the engine is built:
- length groups (`pack_budget` None): texts sorted by length, split into groups of one length
  bucket, each text a row of its own, padded to the bucket (an attention mask marks the padding);
- packed rows: texts laid end to end in rows of at most `pack_budget` tokens (handlers/engine/packing.py),
  then the rows grouped and padded like texts.
Either way every call is a (batch_size, seq_len) shape of the plan's grid, so warm-up covers it.

The steps are pure functions of lengths (`Layout.calls`), shared by the request path, warm-up, the
checks, the planner and the benchmarks. Token ids become one array once per batch (`BatchIds`), and
each call's inputs are filled by index, not text by text.
"""

import dataclasses
import itertools

import numpy as np
import torch

from ts_compiled_handlers.engine import buckets, packing


@dataclasses.dataclass(frozen=True)
class Call:
    """One model call: its shape and, for each real row, the texts in it (by index), in order."""

    group: buckets.Group
    rows: tuple[tuple[int, ...], ...]

    @property
    def texts(self) -> list[int]:
        return [text for row in self.rows for text in row]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Packed rows of at most `pack_budget` tokens with positions from `first_position`, or (None)
    length groups. The engine's build decides it; an AOT package records the build's."""

    pack_budget: int | None = None
    first_position: int = 0
    token_types: bool = False  # the model reads token_type_ids (BERT's text pairs): an input of their own
    per_text: bool = False  # packed rows attend per text (hfserve::text_attention): a package then calls it
    adapters: int = 0  # LoRA adapters served (handlers/graphs/lora.py): each call takes every token's adapter id

    @property
    def packed(self) -> bool:
        return self.pack_budget is not None

    def calls(self, lengths: list[int], plan: buckets.BucketPlan, one_per_row: bool = False) -> list[Call]:
        """The model calls for texts of these token lengths. `one_per_row`: each text a row of its
        own even where texts would be packed (warm-up reaches every (rows, seq_len) shape so)."""
        if not self.packed or one_per_row:
            rows = [(text,) for text in range(len(lengths))]
        else:
            rows = [tuple(row) for row in packing.pack_rows(lengths, self.pack_budget, plan.seq_lens)]
        groups = buckets.group_requests([sum(lengths[text] for text in row) for row in rows], plan)
        return [Call(group, tuple(rows[index] for index in group.indices)) for group in groups]


class BatchIds:
    """A batch's token ids (and token type ids, for pairs) as one flat array, with where each text
    starts and how long it is. The index arithmetic is numpy's: these arrays are a few thousand
    integers at most, and torch would run its small ops on the intra-op threads the model call has
    just left (waking a team costs more than the op: 176 us for a 300-token repeat_interleave with
    2 threads against 3 us in numpy)."""

    def __init__(
        self, token_ids: list[list[int]], type_ids: list[list[int]] | None = None, adapters: list[int] | None = None
    ):
        self.lengths = [len(ids) for ids in token_ids]
        self.flat = flat_array(token_ids)
        self.types = None if type_ids is None else flat_array(type_ids)
        self.adapters = np.zeros(len(token_ids), dtype=np.int64) if adapters is None else np.array(adapters)
        lengths = np.array(self.lengths, dtype=np.int64)
        self.starts = np.cumsum(lengths) - lengths

    def placement(self, call: Call) -> "TextPlacement":
        """Where every token of the call's texts goes in its (batch_size, seq_len) inputs."""
        texts, row_of, start_in_row, segment = [], [], [], []
        for row, members in enumerate(call.rows):
            start = 0
            for number, text in enumerate(members, start=packing.PAD_SEGMENT + 1):
                texts.append(text)
                row_of.append(row)
                start_in_row.append(start)
                segment.append(number)
                start += self.lengths[text]
        lengths = np.array([self.lengths[text] for text in texts], dtype=np.int64)
        first_of_text = np.cumsum(lengths) - lengths  # (texts,) each text's first token in the call
        within = np.arange(int(lengths.sum())) - np.repeat(first_of_text, lengths)  # (tokens,) position in its text
        destination = np.array(row_of, dtype=np.int64) * call.group.seq_len + np.array(start_in_row, dtype=np.int64)
        segment = np.array(segment, dtype=np.int64)
        return TextPlacement(
            texts=texts,
            lengths=lengths,
            source=np.repeat(self.starts[texts], lengths) + within,
            destination=np.repeat(destination, lengths) + within,
            within=within,
            row_of=np.array(row_of, dtype=np.int64),
            segment=segment,
            token_segment=np.repeat(segment, lengths),
        )


def flat_array(rows: list[list[int]]) -> np.ndarray:
    """Lists of integers end to end, as one int64 array."""
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=sum(len(row) for row in rows))


@dataclasses.dataclass(frozen=True)
class TextPlacement:
    """Per text (`texts` order): its length, row and segment; per token: where it comes from in the
    batch's flat ids (`source`), where it goes in the call's flattened inputs (`destination`), its
    position within its text (`within`) and its segment (`token_segment`). Arrays of int64."""

    texts: list[int]
    lengths: np.ndarray
    source: np.ndarray
    destination: np.ndarray
    within: np.ndarray
    row_of: np.ndarray
    segment: np.ndarray
    token_segment: np.ndarray


def call_inputs(
    ids: BatchIds, call: Call, place: TextPlacement, layout: Layout, pad_id: int
) -> dict[str, torch.Tensor]:
    """The call's input tensors, (batch_size, seq_len) each: input_ids and attention_mask for length
    groups; input_ids, position_ids and segments for packed rows; token types and adapter ids where
    the layout has them. A dummy row (static batch) or a
    row's padded tail attends to itself only, so no row is fully masked. Filled in numpy and handed
    to torch without a copy."""
    shape = (call.group.batch_size, call.group.seq_len)
    inputs = {"input_ids": filled(shape, pad_id, place.destination, ids.flat[place.source])}
    if not layout.packed:
        attention_mask = filled(shape, 0, place.destination, 1)
        attention_mask[:, 0] = 1
        inputs["attention_mask"] = attention_mask
    else:
        inputs["position_ids"] = filled(
            shape, layout.first_position, place.destination, place.within + layout.first_position
        )
        inputs["segments"] = filled(shape, packing.PAD_SEGMENT, place.destination, place.token_segment)
    if layout.token_types:
        types = 0 if ids.types is None else ids.types[place.source]
        inputs["token_type_ids"] = filled(shape, 0, place.destination, types)
    if layout.adapters:  # each token its text's adapter, padding none
        inputs["adapter_ids"] = filled(shape, 0, place.destination, np.repeat(ids.adapters[place.texts], place.lengths))
    return {name: torch.from_numpy(array) for name, array in inputs.items()}


def filled(shape: tuple[int, int], fill: int, destination: np.ndarray, values) -> np.ndarray:
    """A (batch_size, seq_len) int64 array of `fill`, with `values` at the flat positions `destination`."""
    array = np.full(shape, fill, dtype=np.int64)
    array.reshape(-1)[destination] = values
    return array


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """A call's inputs, and which rows of its output are its texts', chosen before the call so that
    the engine picks them alone after it: `output[pick]`, in `texts` order; per token, the texts'
    tokens end to end, `lengths` each. Length groups' texts are a slice, no kernel: after the model
    call every small op runs on cold caches."""

    texts: list[int]
    inputs: dict[str, torch.Tensor]
    pick: slice | tuple[torch.Tensor, torch.Tensor]
    lengths: list[int]


def prepare_call(
    ids: BatchIds, call: Call, layout: Layout, pad_id: int, per_token: bool, device: torch.device
) -> PreparedCall:
    """The call's inputs on `device`, and where each text's output row (or tokens) will be: per
    text (rows, ...) or packed (rows, slots, ...) by its row and segment; per token (rows, seq_len,
    ...) by each token's row and position."""
    place = ids.placement(call)
    inputs = call_inputs(ids, call, place, layout, pad_id)
    if device.type != "cpu":
        inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
    if per_token:
        row, column = np.divmod(place.destination, call.group.seq_len)
    elif not layout.packed:  # a text per row (Layout.calls): the call's first rows, in order
        return PreparedCall(place.texts, inputs, slice(0, len(place.row_of)), place.lengths.tolist())
    else:  # a packed row's texts pooled into its slots, the first segment in the first
        row, column = place.row_of, place.segment - 1
    pick = (torch.from_numpy(row).to(device), torch.from_numpy(column).to(device))
    return PreparedCall(place.texts, inputs, pick, place.lengths.tolist())
