"""TextTokenizer calls the fast tokenizer's Rust backend directly (handlers/request/tokenizing.py): the
encodings must be the ones transformers' own call makes, for every tokenizer the tests serve."""

import pytest
from transformers import AutoTokenizer

from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.request.tokenizing import CHARACTERS_PER_TOKEN, TextTokenizer, direct_backend

TEXTS = [
    "the cat sat on the mat",
    "  Ünïcödé, digits 0123456789 and [brackets] {braces} 'quotes' ",
    "hello world " * 40,  # over the limit: cut
    "[CLS] a special token written as text [SEP] <s> </s> <|endoftext|>",
    "x",
]
SHORT = ["the cat sat on the mat", "x"]  # under the limit in every test vocabulary
PAIRS = [("what is the capital of france", "paris is the capital " * 20), ("a", "b")]
LIMIT = 40
MODELS = (
    "embedding",
    "cross-encoder",
    "text-classification-xlmr",
    "text-classification-deberta",
    "embedding-modernbert",
    "embedding-decoder",
    "reranker-causal",
    "text-generation-gpt2",
)  # WordPiece, Unigram, BPE; pair templates


def reference(tokenizer, texts: list, side: str, cut: int, special: bool) -> list:
    """What transformers' own call makes of the texts (its truncation side set for the call)."""
    tokenizer.truncation_side = side
    if isinstance(texts[0], tuple):
        firsts, seconds = zip(*texts, strict=True)
        encodings = tokenizer(list(firsts), list(seconds), truncation=True, max_length=cut).encodings
    else:
        encodings = tokenizer(texts, truncation=True, max_length=cut, add_special_tokens=special).encodings
    return [(encoding.ids, encoding.type_ids, encoding.offsets) for encoding in encodings]


@pytest.mark.parametrize("model", ["minilm", *MODELS])
def test_the_direct_call_makes_the_encodings_transformers_makes(model, tiny_models, minilm_dir):
    folder = minilm_dir if model == "minilm" else tiny_models[model]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert direct_backend(tokenizer) is not None, "a fast tokenizer the direct call should serve"
    for side in ("right", "left"):
        for reject in (False, True):
            for special in (True, False):
                tokenize = TextTokenizer(tokenizer, LIMIT, reject, special_tokens=special)
                cut = LIMIT + 1 if reject else LIMIT
                # a refusing tokenizer cuts one token over the limit, then refuses: short texts only
                for texts in (SHORT, PAIRS[1:]) if reject else (TEXTS, PAIRS):
                    made = [(e.ids, e.type_ids, e.offsets) for e in tokenize(texts, side=side).encodings]
                    assert made == reference(AutoTokenizer.from_pretrained(folder), texts, side, cut, special)


@pytest.mark.parametrize("model", ["minilm", *MODELS])
def test_without_offsets_the_ids_and_token_types_are_the_same(model, tiny_models, minilm_dir):
    folder = minilm_dir if model == "minilm" else tiny_models[model]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for side in ("right", "left"):
        with_offsets = TextTokenizer(tokenizer, LIMIT, reject=False)
        without = TextTokenizer(tokenizer, LIMIT, reject=False, offsets=False)
        for texts in (TEXTS, PAIRS):
            made, fast = with_offsets(texts, side=side), without(texts, side=side)
            assert fast.token_ids == made.token_ids
            assert fast.type_ids == made.type_ids
            assert [(e.ids, e.type_ids, e.attention_mask) for e in fast.encodings] == [
                (e.ids, e.type_ids, e.attention_mask) for e in made.encodings
            ]


def test_a_tokenizer_whose_class_rewrites_the_call_is_called_as_it_is(minilm_dir):
    base = AutoTokenizer.from_pretrained(minilm_dir)

    class Rewritten(type(base)):
        def _encode_plus(self, *args, **kwargs):
            return super()._encode_plus(*args, **kwargs)

    base.__class__ = Rewritten
    assert direct_backend(base) is None
    tokenize = TextTokenizer(base, LIMIT, reject=False)
    assert tokenize.backend is None
    assert tokenize(["the cat sat"]).token_ids == [
        AutoTokenizer.from_pretrained(minilm_dir)("the cat sat")["input_ids"]
    ]


def test_a_text_past_the_characters_its_limit_can_hold_is_cut_before_tokenizing_or_refused(tiny_models):
    """A 6 MB text took seconds to tokenize for 40 tokens: it is cut to CHARACTERS_PER_TOKEN per token
    first, with the same ids; refused where over-long texts are, or where a cut at its start would move
    the characters an answer's offsets count."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["embedding"])
    most = CHARACTERS_PER_TOKEN * LIMIT
    long = "the cat sat on the mat " * (most // 10)
    cutting = TextTokenizer(tokenizer, LIMIT, reject=False, offsets=False)
    for side in ("right", "left"):
        assert cutting([long], side=side).token_ids == [reference(tokenizer, [long], side, LIMIT, True)[0][0]]
    pair = cutting([("a query", long)]).token_ids
    assert pair == [reference(tokenizer, [("a query", long)], "right", LIMIT, True)[0][0]]
    refusing = TextTokenizer(tokenizer, LIMIT, reject=True)
    for tokenize, side in ((refusing, "right"), (TextTokenizer(tokenizer, LIMIT, reject=False), "left")):
        with pytest.raises(RequestError) as refused:
            tokenize(["fine", long], side=side)
        assert refused.value.status == 413 and f"text 1 has {len(long)} characters" in refused.value.message


def test_token_ids_a_client_sends_stay_within_the_model_s_embedding_table(tiny_models):
    """A tokenizer may know tokens its model has no embedding for (added, the model not resized)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["embedding"])
    tokenize = TextTokenizer(tokenizer, LIMIT, reject=False, embeddings=10)
    assert tokenize.ids([[5, 9]]).token_ids == [[5, 9]]
    with pytest.raises(RequestError, match=r"outside the vocabulary \(0 to 9\)"):
        tokenize.ids([[5, 9], [5, 10]])
    assert TextTokenizer(tokenizer, LIMIT, reject=False, embeddings=10**6).vocabulary == len(tokenizer)
