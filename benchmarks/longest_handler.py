"""Our embedding handler with compilation off and every batch padded to its longest text.

The load test's "best simple hand-written handler": same request parsing, tokenizer and pooling as
ours (build it with `compile.enable: false`), but no length buckets: one eager forward pass per
TorchServe batch, padded to the batch's longest text.
"""

import torch

from handlers import buckets
from handlers.embedding import EmbeddingHandler


class PadToLongestHandler(EmbeddingHandler):
    def infer(self, token_ids: list[list[int]], model=None) -> list[torch.Tensor]:
        model = model or self.model
        group = buckets.Group(tuple(range(len(token_ids))), len(token_ids), max(len(ids) for ids in token_ids))
        inputs = buckets.pad_group(token_ids, group, self.pad_id)
        with torch.inference_mode():
            output = model({name: tensor.to(self.device) for name, tensor in inputs.items()}).float().cpu()
        if self.initialized:
            self.record_padding([len(ids) for ids in token_ids], [group])
        return list(output)
