"""Our embedding handler with compilation off and every batch padded to its longest text.

The load test's "best simple hand-written handler": same request parsing, tokenizer and pooling as
ours (build it with `compile.enable: false` and `buckets.pack_tokens: off`), but no length buckets
and no packing: one eager forward pass per TorchServe batch, padded to the batch's longest text.
"""

from handlers import buckets
from handlers.embedding import EmbeddingHandler


class PadToLongestHandler(EmbeddingHandler):
    def prepare(self, token_ids: list[list[int]], one_per_row: bool = False) -> list[buckets.Prepared]:
        group = buckets.Group(tuple(range(len(token_ids))), len(token_ids), max(len(ids) for ids in token_ids))
        return [buckets.Prepared(group, buckets.pad_group(token_ids, group, self.pad_id))]
