"""What a task answers per text: one frozen dataclass per kind, which the protocols encode by its
fields, so none of them reads a dict's keys or guesses a shape.

An answer per text is one of these, or a list of them where a text has several (a classifier's
labels, token classification's entities). A field's name is the key the plain protocol writes:
`written` makes each answer the object of its fields that are not None (numpy rows kept for
handlers/runtime/json_text.py to write shortest), so the bodies are what they were when answers
were dicts. KServe v2 makes one output tensor per field (`TENSORS`); a field without a fixed
shape (a ColBERT text's vectors) and the entity lists go as JSON strings instead.
"""

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True, slots=True)
class Vector:
    """One embedding of a text or an image: float32, or int8/uint8/binary values (`precision`)."""

    embedding: np.ndarray | list


@dataclasses.dataclass(frozen=True, slots=True)
class Vectors:
    """One text's embedding in several precisions, by name (Cohere's `embedding_types`)."""

    embeddings: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class HiddenStates:
    """Every token's last hidden state, (tokens, hidden) float32 (TEI's `embed_all`)."""

    token_states: np.ndarray


@dataclasses.dataclass(frozen=True, slots=True)
class MultiVector:
    """A ColBERT text's vectors, (tokens kept, dimension)."""

    embedding: np.ndarray


@dataclasses.dataclass(frozen=True, slots=True)
class Sparse:
    """A sparse embedding's non-zero entries: vocabulary indices, ascending, and their weights."""

    indices: list[int]
    values: list[float]


@dataclasses.dataclass(frozen=True, slots=True)
class M3:
    """What bge-m3 answers for a text: the outputs the request asked for (the others None, not
    written): the dense vector, `{token id: weight}`, and the ColBERT vectors."""

    dense_vecs: np.ndarray | None = None
    lexical_weights: dict[str, float] | None = None
    colbert_vecs: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Score:
    """A relevance score: a cross-encoder's for a pair, a document's against the query."""

    score: float


@dataclasses.dataclass(frozen=True, slots=True)
class QueryVectors:
    """A scoring request's first answer: how many vectors its query has (the documents' follow)."""

    query_vectors: int


@dataclasses.dataclass(frozen=True, slots=True)
class Label:
    """One label and its probability (a text's answer is a list of them, best first)."""

    label: str
    score: float


@dataclasses.dataclass(frozen=True, slots=True)
class Entity:
    """One token's best label (token classification without aggregation), as transformers' pipeline."""

    entity: str
    score: float
    index: int
    word: str
    start: int
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class EntityGroup:
    """Adjacent tokens of one entity type merged (`aggregation_strategy: simple`)."""

    entity_group: str
    score: float
    word: str
    start: int
    end: int


@dataclasses.dataclass(frozen=True, slots=True)
class Generated:
    """A prompt's continuation once it is finished."""

    generated_text: str
    finish_reason: str
    generated_tokens: int


# The kinds KServe v2 writes as one tensor per field (a list of them, top-k labels, as a tensor of
# one more dimension; a field whose rows differ in shape as JSON strings); entities go as JSON.
TENSORS = (Vector, Vectors, HiddenStates, MultiVector, Sparse, M3, Score, QueryVectors, Label, Generated)


def written(answer: Any) -> Any:
    """An answer as the JSON values of its body (a dataclass as its `fields`, a list item by item):
    what a protocol's `encode` hands on, so a handler subclass's `postprocess` reads plain objects."""
    if isinstance(answer, list):
        return [written(item) for item in answer]
    return fields(answer) if dataclasses.is_dataclass(answer) else answer


def fields(answer: Any) -> dict[str, Any]:
    """A dataclass answer as the object JSON writes: its fields that are not None."""
    if not dataclasses.is_dataclass(answer) or isinstance(answer, type):
        raise TypeError(f"Object of type {type(answer).__name__} is not JSON serializable")
    return {
        field.name: value for field in dataclasses.fields(answer) if (value := getattr(answer, field.name)) is not None
    }
