"""Token logits to entities, with the rules of transformers' token-classification pipeline.

Strategy `none` answers every token whose best label is not `O`; `simple` first merges runs of
adjacent tokens that continue one entity (B-X then I-X..., or equal plain tags), averaging scores.
"""

import torch
from tokenizers import Encoding

from ts_compiled_handlers.request.answers import Entity, EntityGroup

AGGREGATIONS = ("none", "simple")
IGNORED_LABELS = ("O",)


def token_entities(logits: torch.Tensor, encoding: Encoding, text: str, tokenizer, id2label) -> list[Entity]:
    """One entity per non-special token: its best label and score, its token and character span."""
    probabilities = torch.softmax(logits[: len(encoding.ids)].float(), dim=-1)
    entities = []
    for index, (token_id, (start, end)) in enumerate(zip(encoding.ids, encoding.offsets, strict=True)):
        if encoding.special_tokens_mask[index]:
            continue
        best = int(probabilities[index].argmax())
        word = text[start:end] if token_id == tokenizer.unk_token_id else tokenizer.convert_ids_to_tokens(token_id)
        entities.append(Entity(id2label[best], probabilities[index, best].item(), index, word, start, end))
    return entities


def _tag(label: str) -> tuple[str, str]:
    """("B" or "I", entity type) of a label; a label without a prefix continues like I-."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def group_entities(entities: list[Entity], tokenizer) -> list[EntityGroup]:
    """Merge adjacent token entities of one type into `entity_group`s (strategy `simple`)."""
    runs: list[list[Entity]] = []
    for entity in entities:
        prefix, tag = _tag(entity.entity)
        if runs and prefix != "B" and _tag(runs[-1][-1].entity)[1] == tag:
            runs[-1].append(entity)
        else:
            runs.append([entity])
    return [
        EntityGroup(
            _tag(run[0].entity)[1],
            sum(entity.score for entity in run) / len(run),
            tokenizer.convert_tokens_to_string([entity.word for entity in run]),
            run[0].start,
            run[-1].end,
        )
        for run in runs
    ]


def entities_for(logits, encoding, text, tokenizer, id2label, aggregation: str) -> list[Entity] | list[EntityGroup]:
    """The pipeline's answer for one text under `aggregation` (`none` or `simple`)."""
    found = token_entities(logits, encoding, text, tokenizer, id2label)
    if aggregation == "simple":
        return [group for group in group_entities(found, tokenizer) if group.entity_group not in IGNORED_LABELS]
    return [entity for entity in found if entity.entity not in IGNORED_LABELS]
