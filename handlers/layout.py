"""How a batch's tokenized texts become model calls, and how the calls' outputs become one row per text.

Two layouts, chosen once when the engine is built:
- length groups (`pack_budget` None): texts sorted by length, split into groups of one length
  bucket, each text a row of its own, padded to the bucket (an attention mask marks the padding);
- packed rows: texts laid end to end in rows of at most `pack_budget` tokens (handlers/packing.py),
  then the rows grouped and padded like texts.
Either way every call is a (batch_size, seq_len) shape of the plan's grid, so warm-up covers it.

The steps are pure functions of lengths (`Layout.calls`), shared by the request path, warm-up, the
checks, the planner and the benchmarks. Token ids become tensors once per batch (`BatchIds`), and
each call's inputs are filled by index, not text by text.
"""

import dataclasses
import itertools

import torch

from ts_compiled_handlers import buckets, packing


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
    """A batch's token ids (and token type ids, for pairs) as one flat tensor, with where each text
    starts and how long it is."""

    def __init__(self, token_ids: list[list[int]], type_ids: list[list[int]] | None = None):
        self.lengths = [len(ids) for ids in token_ids]
        self.flat = torch.tensor(list(itertools.chain.from_iterable(token_ids)), dtype=torch.long)
        self.types = None if type_ids is None else torch.tensor(list(itertools.chain.from_iterable(type_ids)))
        self.starts = torch.tensor([0, *itertools.accumulate(self.lengths)][:-1], dtype=torch.long)

    def placement(self, call: Call) -> "Placement":
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
        lengths = torch.tensor([self.lengths[text] for text in texts], dtype=torch.long)
        total = int(lengths.sum())
        first_of_text = torch.cumsum(lengths, 0) - lengths  # (texts,) each text's first token in the call
        within = torch.arange(total) - first_of_text.repeat_interleave(lengths)  # (tokens,) position in its text
        seq_len = call.group.seq_len
        destination = torch.tensor(row_of) * seq_len + torch.tensor(start_in_row)
        return Placement(
            texts=texts,
            lengths=lengths,
            source=self.starts[texts].repeat_interleave(lengths) + within,
            destination=destination.repeat_interleave(lengths) + within,
            within=within,
            row_of=torch.tensor(row_of),
            segment=torch.tensor(segment),
        )


@dataclasses.dataclass(frozen=True)
class Placement:
    """Per text (`texts` order): its length, row and segment; per token: where it comes from in the
    batch's flat ids (`source`), where it goes in the call's flattened inputs (`destination`), and
    its position within its text (`within`)."""

    texts: list[int]
    lengths: torch.Tensor
    source: torch.Tensor
    destination: torch.Tensor
    within: torch.Tensor
    row_of: torch.Tensor
    segment: torch.Tensor


def call_inputs(ids: BatchIds, call: Call, place: Placement, layout: Layout, pad_id: int) -> dict[str, torch.Tensor]:
    """The call's input tensors, (batch_size, seq_len) each: input_ids and attention_mask for length
    groups; input_ids, position_ids and segments for packed rows. A dummy row (static batch) or a
    row's padded tail attends to itself only, so no row is fully masked."""
    shape = (call.group.batch_size, call.group.seq_len)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    input_ids.view(-1)[place.destination] = ids.flat[place.source]
    if not layout.packed:
        attention_mask = torch.zeros(shape, dtype=torch.long)
        attention_mask[:, 0] = 1
        attention_mask.view(-1)[place.destination] = 1
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    else:
        position_ids = torch.full(shape, layout.first_position, dtype=torch.long)
        position_ids.view(-1)[place.destination] = place.within + layout.first_position
        segments = torch.full(shape, packing.PAD_SEGMENT, dtype=torch.long)
        segments.view(-1)[place.destination] = place.segment.repeat_interleave(place.lengths)
        inputs = {"input_ids": input_ids, "position_ids": position_ids, "segments": segments}
    if layout.token_types:
        token_type_ids = torch.zeros(shape, dtype=torch.long)
        if ids.types is not None:
            token_type_ids.view(-1)[place.destination] = ids.types[place.source]
        inputs["token_type_ids"] = token_type_ids
    return inputs


def text_rows(output: torch.Tensor, call: Call, place: Placement, layout: Layout, per_token: bool) -> torch.Tensor:
    """The call's output rows of its real texts, in `place.texts` order, picked by one index each:
    per text (texts, ...) from (rows, ...) or packed (rows, slots, ...); per token, the texts' tokens
    end to end (tokens, ...) from (rows, seq_len, ...), for the caller to split by `place.lengths`."""
    if per_token:
        return output.flatten(0, 1)[place.destination.to(output.device)]
    if not layout.packed:
        return output[place.row_of.to(output.device)]
    slots = packing.text_slots(call.group.seq_len)
    return output.flatten(0, 1)[(place.row_of * slots + place.segment - 1).to(output.device)]
