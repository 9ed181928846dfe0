"""Our embedding handler with compilation off and every batch padded to its longest text.

The load test's "best simple hand-written handler": same request parsing, tokenizer and pooling as
ours (build it with `compile.enable: false` and `buckets.pack_tokens: off`), but no length buckets
and no packing: one eager forward pass per TorchServe batch, padded to the batch's longest text.
"""

from ts_compiled_handlers.engine import buckets, layout
from ts_compiled_handlers.servers.torchserve.handler import Handler
from ts_compiled_handlers.tasks.embedding import EmbeddingTask


class PadToLongestHandler(Handler):
    class PadToLongest(layout.Layout):  # nested: a handler file defines exactly one class
        """One call per batch, each text a row padded to the batch's longest."""

        def calls(self, lengths: list[int], plan: buckets.BucketPlan, one_per_row: bool = False) -> list:
            texts = tuple(range(len(lengths)))
            return [layout.Call(buckets.Group(texts, len(lengths), max(lengths)), tuple((text,) for text in texts))]

    class task_class(EmbeddingTask):
        def engine(self, model, serving, dtype, layout):
            return super().engine(model, serving, dtype, PadToLongestHandler.PadToLongest())
