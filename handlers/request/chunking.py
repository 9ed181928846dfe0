"""Long documents cut into chunks of at most N tokens, for bulk jobs (handlers/servers/ray/data.py).

A chunk is a character span of its document: it starts and ends on token boundaries, never inside
a token, and where it can, on a word's start (after whitespace), so that the chunk's text, read on
its own, tokenizes into the same tokens. Where it cannot (a long run without whitespace: chemistry,
URLs, code), the chunk's first piece is read as a word's start and may split into more tokens than
were counted; `fitting_spans` then cuts that document again, smaller, until every chunk fits.
Consecutive chunks share up to `overlap` tokens. Every token of the document lies in a chunk; a
document that fits is one chunk, the whole text. The chunk's text is what gets embedded, so its
vector is the embedding of `text[start:end]` as any client would get it.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class ChunkSize:
    """At most `tokens` tokens a chunk, `overlap` of them shared with the chunk before."""

    tokens: int
    overlap: int = 0

    def check(self, model_limit: int) -> None:
        """ValueError naming the option at fault (as embed-corpus's flags name them): an overlap not
        below the size, a size over what a text of the archive may hold."""
        if self.tokens < 1:
            raise ValueError(f"--chunk-tokens must be at least 1, not {self.tokens}")
        if not 0 <= self.overlap < self.tokens:
            raise ValueError(f"--chunk-overlap must be at least 0 and below --chunk-tokens ({self.tokens})")
        if self.tokens > model_limit:
            raise ValueError(
                f"--chunk-tokens {self.tokens} is over the {model_limit} tokens a text of this archive may hold "
                "(its length limit less its special tokens and default prompt)"
            )


def word_starts(offsets: list[tuple[int, int]]) -> list[bool]:
    """Whether each token starts a word: the first, or one that whitespace (a gap) separates from the last."""
    return [index == 0 or start > offsets[index - 1][1] for index, (start, _) in enumerate(offsets)]


def chunk_spans(offsets: list[tuple[int, int]], text_length: int, size: ChunkSize) -> list[tuple[int, int]]:
    """The character spans of one document's chunks, from its tokens' offsets (no special tokens)."""
    if len(offsets) <= size.tokens:
        return [(0, text_length)]
    starts = word_starts(offsets)
    spans, first = [], 0
    while True:
        end = first + size.tokens
        if end >= len(offsets):
            spans.append((offsets[first][0] if spans else 0, text_length))
            return spans
        # end at a word's start in the chunk's second half where there is one, else at the token limit
        end = next((index for index in range(end, first + size.tokens // 2, -1) if starts[index]), end)
        spans.append((offsets[first][0] if spans else 0, offsets[end - 1][1]))
        following = max(end - size.overlap, first + 1)
        # the next chunk starts at a word's start within the overlap where there is one
        first = next((index for index in range(following, end) if starts[index]), following)


def fitting_spans(text: str, offsets: list[tuple[int, int]], size: ChunkSize, count) -> list[tuple[int, int]]:
    """`chunk_spans` whose every chunk's text, read alone, holds at most `size.tokens` tokens
    (`count(texts)`: their token counts): a document with a chunk over it is cut again, its chunks
    smaller by the excess, until none is (a chunk of 1 token cannot grow)."""
    cut = size
    while True:
        spans = chunk_spans(offsets, len(text), cut)
        if len(spans) == 1 and len(offsets) <= size.tokens:
            return spans  # the whole text, as counted
        excess = max(count([text[start:end] for start, end in spans])) - size.tokens
        if excess <= 0 or cut.tokens == 1:
            return spans
        tokens = max(1, cut.tokens - excess)
        cut = ChunkSize(tokens, min(cut.overlap, tokens - 1))
