"""Texts to token ids with the model's fast tokenizer, the plan's length limit and the overflow policy."""

from tokenizers import Encoding

from handlers.payload import RequestError


class TextTokenizer:
    """Tokenizes a request's texts at most `limit` tokens long: longer ones are truncated, or refused
    (413) with `reject`. Each text's ids are read from its encoding once (`Encoding.ids` makes a new
    list at every access)."""

    def __init__(self, tokenizer, limit: int, reject: bool):
        self.tokenizer = tokenizer
        self.limit = limit
        self.reject = reject

    def __call__(self, texts: list[str]) -> tuple[list[Encoding], list[list[int]]]:
        # One token over the limit is enough to tell an over-long text apart.
        cut = self.limit + 1 if self.reject else self.limit
        encodings = self.tokenizer(texts, truncation=True, max_length=cut).encodings
        token_ids = [encoding.ids for encoding in encodings]
        for position, ids in enumerate(token_ids):
            if not ids:
                raise RequestError(400, f"text {position} makes no tokens")
            if len(ids) > self.limit:
                raise RequestError(
                    413, f"text {position} is longer than {self.limit} tokens; shorten it or set overflow: truncate"
                )
        return encodings, token_ids
