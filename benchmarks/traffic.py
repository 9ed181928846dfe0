"""The standard traffic of the benchmarks: seeded token lengths, and texts that have exactly them.

Lengths are lognormal (median 30 tokens, sigma 0.8) clipped to 5..256: many short requests and a
long tail, the shape of real search and classification traffic.
"""

import math

import numpy as np


def traffic_lengths(count: int, seed: int, median: float = 30, sigma: float = 0.8, low=5, high=256) -> list[int]:
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(mean=math.log(median), sigma=sigma, size=count)
    return np.clip(np.round(lengths), low, high).astype(int).tolist()


def single_token_words(tokenizer) -> list[str]:
    """Vocabulary words that the tokenizer keeps as one token (so a text's length is exact)."""
    words = sorted(word for word in tokenizer.get_vocab() if word.isascii() and word.isalpha() and len(word) > 2)
    return [word for word in words if len(tokenizer.tokenize(" " + word)) == 1]


def texts_of_lengths(tokenizer, lengths: list[int], seed: int) -> list[str]:
    """One text per length whose tokenization (special tokens included) is that many tokens."""
    words = single_token_words(tokenizer)
    rng = np.random.default_rng(seed)
    special = len(tokenizer("")["input_ids"])
    texts = []
    for length in lengths:
        texts.append(" ".join(words[i] for i in rng.integers(0, len(words), max(1, length - special))))
    return texts


def with_repeats(items: list, share: float, seed: int) -> list:
    """The stream with `share` of its items (after the first) replaced by an earlier item of the
    stream, picked uniformly: re-indexing and RAG traffic resend texts (one public corpus: 37%)."""
    rng = np.random.default_rng(seed + 1)
    stream = list(items[:1])
    for item, repeat, pick in zip(items[1:], rng.random(len(items)), rng.random(len(items)), strict=False):
        stream.append(stream[int(pick * len(stream))] if repeat < share else item)
    return stream


def ids_of_lengths(probes, lengths: list[int]) -> list[list[int]]:
    """One row of token ids per length, as the model's probes fill them (special tokens in place),
    seeded by position: every contender of a run gets the same ids, and tokenizing is left out."""
    from ts_compiled_handlers.startup import warmup

    fill = warmup.filler_ids
    return [fill(length, 1, probes.vocab_size, probes.special, seed=i)[0] for i, length in enumerate(lengths)]
