"""Texts (or text pairs) to token ids with the model's fast tokenizer, the plan's length limit, and
each request's overflow policy and truncation side."""

import copy
import dataclasses
from typing import Any

from tokenizers import Encoding, Tokenizer

from ts_compiled_handlers.request.payload import RequestError

SIDES = ("right", "left")
# Characters read per token of the limit, as TEI bounds what it tokenizes: a longer text would be cut
# anyway (no real tokenizer's first `limit` tokens span that much), so it is cut to that before the
# tokenizer reads it, or refused where it must not be cut. A 6 MB text took seconds to tokenize.
CHARACTERS_PER_TOKEN = 250


def direct_backend(tokenizer) -> Tokenizer | None:
    """The fast tokenizer's Rust backend where transformers' call adds nothing to it but its
    settings (a `TokenizersBackend` whose class keeps the base call), else None. Calling the
    backend directly skips the Python that transformers' call spends per request (kwargs,
    strategies, a BatchEncoding: 56 us against 46 for a 40-token text in process) and gives the
    same encodings (tests/unit/test_tokenizing.py)."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    kind = type(tokenizer)
    if (
        not isinstance(tokenizer, TokenizersBackend)
        or kind.__call__ is not PreTrainedTokenizerBase.__call__
        or kind._encode_plus is not TokenizersBackend._encode_plus
        or hasattr(tokenizer, "_switch_to_input_mode")
    ):
        return None
    return tokenizer.backend_tokenizer


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """A request's texts tokenized: encodings (offsets, special tokens), ids for the model, and for
    text pairs each token's type (None: single texts, all type 0)."""

    encodings: list[Encoding]
    token_ids: list[list[int]]
    type_ids: list[list[int]] | None = None


@dataclasses.dataclass(frozen=True)
class Accepted:
    """A request that passed its checks: its position in the call that brought it (a batch's index;
    0 where requests come one at a time), the request, its texts tokenized, and its trace's record."""

    index: int
    request: Any
    tokenized: Tokenized
    trace: Any = None  # its RequestTrace where the worker traces (handlers/runtime/tracing.py)

    @property
    def token_ids(self) -> list[list[int]]:
        return self.tokenized.token_ids

    @property
    def encodings(self) -> list[Encoding]:
        return self.tokenized.encodings

    @property
    def tokens(self) -> int:
        """The request's tokens, special ones included, after truncation: its usage."""
        return sum(len(ids) for ids in self.tokenized.token_ids)

    @property
    def work(self) -> int:
        """What the request weighs in a call's token budget: its tokens, and its images' patches
        (handlers/protocols/image_bodies.py), so that a call of images and texts keeps to the budget."""
        images = getattr(self.request, "images", None)
        return self.tokens + (images.tokens if images is not None else 0)


class TextTokenizer:
    """Tokenizes texts at most `limit` tokens long: longer ones are truncated (on the tokenizer's
    side, or the side a request names) or refused with 413 (`reject`, or a request's `truncate:
    false`). Each text's ids are read from its encoding once (`Encoding.ids` makes a new list at
    every access). `special_tokens: false` for texts already in the model's form (a rendered chat
    template); `truncates: false` refuses every over-long text, for texts a cut would break;
    `offsets: false` where no one reads a token's characters (its offsets are then zeros): the Rust
    tokenizer's fast batch call skips tracking them, 41 us against 49 for a 40-word text."""

    def __init__(
        self,
        tokenizer,
        limit: int,
        reject: bool,
        special_tokens: bool = True,
        truncates: bool = True,
        offsets: bool = True,
        embeddings: int | None = None,
    ):
        self.limit = limit
        self.reads_offsets = offsets
        self.offsets = offsets or not hasattr(Tokenizer, "encode_batch_fast")  # tokenizers < 0.20 lacks it
        self.reject = reject
        self.truncates = truncates
        self.special_tokens = special_tokens
        self.by_side = {tokenizer.truncation_side: tokenizer}
        for side in SIDES:  # a copy per side: truncation_side is the tokenizer's state, shared by every call
            if side not in self.by_side:
                self.by_side[side] = copy.deepcopy(tokenizer)
                self.by_side[side].truncation_side = side
        self.default_side = tokenizer.truncation_side
        # the ids a client may send: the tokenizer's, within the model's embedding table (`embeddings`:
        # tokens added to a tokenizer but not to its model would index past it: a 500, on CUDA an
        # assert that breaks every later call)
        self.vocabulary = min(len(tokenizer), embeddings or len(tokenizer))
        self.backend = direct_backend(tokenizer)
        self.split_special = getattr(tokenizer, "split_special_tokens", False)
        self.backends = {}  # (side, most tokens): the backend truncating there

    def __call__(self, texts: list, truncate: bool | None = None, side: str | None = None) -> Tokenized:
        side = side or self.default_side
        cut = self.limit + 1 if self._rejects(truncate) else self.limit  # one over tells an over-long text
        texts = self._bounded(texts, self._rejects(truncate), side)
        pairs = bool(texts) and isinstance(texts[0], tuple)
        special = self.special_tokens or pairs
        if self.backend is not None:
            backend = self._backend(side, cut)
            encode = backend.encode_batch if self.offsets else backend.encode_batch_fast
            encodings = encode(texts, add_special_tokens=special)
        elif pairs:
            firsts, seconds = zip(*texts, strict=True)
            encodings = self.by_side[side](list(firsts), list(seconds), truncation=True, max_length=cut).encodings
        else:
            encodings = self.by_side[side](texts, truncation=True, max_length=cut, add_special_tokens=special).encodings
        token_ids = [encoding.ids for encoding in encodings]
        self._check_lengths(token_ids)
        return Tokenized(encodings, token_ids, [encoding.type_ids for encoding in encodings] if pairs else None)

    def _bounded(self, texts: list, rejects: bool, side: str) -> list:
        """The texts at most CHARACTERS_PER_TOKEN characters per token of the limit: a longer one
        cut on `side` (each text of a pair), or refused with 413 where over-long texts are, and
        where a cut at the start would move the characters that answers' offsets count."""
        most = CHARACTERS_PER_TOKEN * self.limit
        rejects = rejects or (side == "left" and self.reads_offsets)

        def bounded(position: int, text: str) -> str:
            if len(text) <= most:
                return text
            if rejects:
                remedy = "shorten it, or send truncate: true" if self.truncates else "shorten it"
                message = f"text {position} has {len(text)} characters, more than {self.limit} tokens can hold"
                raise RequestError(413, f"{message} ({most}); {remedy}")
            return text[-most:] if side == "left" else text[:most]

        return [
            tuple(bounded(position, part) for part in text) if isinstance(text, tuple) else bounded(position, text)
            for position, text in enumerate(texts)
        ]

    def _backend(self, side: str, cut: int):
        """The Rust tokenizer set up as the tokenizer's own call sets it for `truncation=True,
        max_length=cut` on `side`: a copy per setting, made once (the setting is its state)."""
        if (side, cut) not in self.backends:
            backend = Tokenizer.from_str(self.backend.to_str())
            backend.no_padding()
            backend.enable_truncation(cut, stride=0, strategy="longest_first", direction=side)
            backend.encode_special_tokens = self.split_special
            self.backends[side, cut] = backend
        return self.backends[side, cut]

    def ids(self, token_ids: list[list[int]], truncate: bool | None = None, side: str | None = None) -> Tokenized:
        """Token ids a client sent, taken as the model's input as they are (no special tokens added):
        each id must be in the vocabulary; a list over the limit is cut or refused as a text is."""
        for position, ids in enumerate(token_ids):
            if not all(0 <= token < self.vocabulary for token in ids):
                top = self.vocabulary - 1
                raise RequestError(
                    400, f"'input'[{position}] holds a token id outside the vocabulary (0 to {top})", "input"
                )
        if not self._rejects(truncate):
            left = (side or self.default_side) == "left"
            token_ids = [ids[-self.limit :] if left else ids[: self.limit] for ids in token_ids]
        self._check_lengths(token_ids)
        return Tokenized([], [list(ids) for ids in token_ids])

    def _rejects(self, truncate: bool | None) -> bool:
        """Whether an over-long text is refused: the request's `truncate` where given, else the build's."""
        return not self.truncates or (self.reject if truncate is None else not truncate)

    def _check_lengths(self, token_ids: list[list[int]]) -> None:
        for position, ids in enumerate(token_ids):
            if not ids:
                raise RequestError(400, f"text {position} makes no tokens")
            if len(ids) > self.limit:
                remedy = (
                    "shorten it, or send truncate: true (or build with overflow: truncate)"
                    if self.truncates
                    else "shorten it (this model's chat template ends each text where its score is read: no cut)"
                )
                raise RequestError(413, f"text {position} is longer than {self.limit} tokens; {remedy}")
