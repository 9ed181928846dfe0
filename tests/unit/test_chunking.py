"""Long documents cut into token chunks: every token in a chunk, no chunk over its size when its text
is tokenized on its own, overlaps as asked, and the options checked."""

import random

import pytest
from transformers import AutoTokenizer

from ts_compiled_handlers.request.chunking import ChunkSize, chunk_spans, fitting_spans

WORDS = "alice walks to paris quickly, the cat sat on 3.5 red mats; unbelievably zürich-bound €20 emoji 🙂".split()


def document(tokens_wanted: int, tokenizer, seed: int) -> str:
    words, pick = [], random.Random(seed)
    while len(tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]) < tokens_wanted:
        words.extend(pick.choice(WORDS) for _ in range(max(1, (tokens_wanted - len(words)) // 2)))
    return " ".join(words)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return AutoTokenizer.from_pretrained(minilm_dir)


@pytest.mark.parametrize("tokens", [10, 127, 128, 129, 700, 5000])
@pytest.mark.parametrize("overlap", [0, 16])
def test_chunks_cover_every_token_and_hold_at_most_their_size_read_alone(tokenizer, tokens, overlap):
    text = document(tokens, tokenizer, seed=tokens)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    size = ChunkSize(128, overlap)
    spans = chunk_spans(offsets, len(text), size)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(start < end for start, end in spans) and spans == sorted(spans)
    for start, end in offsets:  # every token inside a chunk, none cut
        assert any(chunk_start <= start and end <= chunk_end for chunk_start, chunk_end in spans)
    lengths = [len(tokenizer(text[start:end], add_special_tokens=False)["input_ids"]) for start, end in spans]
    assert max(lengths) <= 128
    if len(offsets) <= 128:
        assert spans == [(0, len(text))]
    else:
        assert len(spans) <= -(-len(offsets) // ((128 - overlap) // 2)) and min(lengths[:-1]) >= 64
        shared = [min(end, spans[index + 1][1]) - spans[index + 1][0] for index, (_, end) in enumerate(spans[:-1])]
        assert all(chars > 0 for chars in shared) if overlap else all(chars <= 0 for chars in shared)


def test_an_overlap_not_below_the_size_or_a_size_over_the_limit_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="--chunk-overlap"):
        ChunkSize(64, 64).check(510)
    with pytest.raises(ValueError, match="--chunk-overlap"):
        ChunkSize(64, -1).check(510)
    with pytest.raises(ValueError, match="--chunk-tokens 600 is over the 510"):
        ChunkSize(600, 0).check(510)
    with pytest.raises(ValueError, match="--chunk-tokens"):
        ChunkSize(0).check(510)
    ChunkSize(510, 509).check(510)


@pytest.mark.parametrize("size", [ChunkSize(16, 0), ChunkSize(16, 4), ChunkSize(32, 8)])
def test_a_run_without_word_starts_is_cut_again_until_each_chunk_read_alone_fits(tokenizer, size):
    """A chunk that starts inside a word (a long run of no whitespace: chemistry, URLs, code) reads
    its first piece as a word's start: WordPiece may split it into more tokens than were counted,
    and a chunk over the archive's limit failed the whole job."""
    text = "see " + "Pneumonoultramicroscopicsilicovolcanoconiosis-hydroxymethylpyrimidinephosphatase" * 6 + " end"
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]

    def counts(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    naive = chunk_spans(offsets, len(text), size)
    assert max(counts([text[start:end] for start, end in naive])) > size.tokens  # the case this guards
    spans = fitting_spans(text, offsets, size, counts)
    assert max(counts([text[start:end] for start, end in spans])) <= size.tokens
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for start, end in offsets:  # still every token inside a chunk
        assert any(chunk_start <= start and end <= chunk_end for chunk_start, chunk_end in spans)
