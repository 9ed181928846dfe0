"""Choosing the next token per row: greedy, or sampled with temperature, top-k and top-p.

Each row has its own parameters and its own seeded generator, so a request's output does not depend
on the other requests it was batched with.
"""

import dataclasses
import secrets

import torch


@dataclasses.dataclass
class Sampler:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    generator: torch.Generator = dataclasses.field(init=False)

    def __post_init__(self):
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed)

    def choose(self, logits: torch.Tensor) -> int:
        """The next token id from one row of logits (vocab,)."""
        if not self.do_sample:
            return int(logits.argmax())
        # In float64, where every temperature the request check admits (> 0) is itself nonzero, and
        # shifted so the best score is 0: a tiny temperature then gives 0 and -inf, never nan.
        scores = logits.double()
        scores = (scores - scores.max()) / self.temperature
        if 0 < self.top_k < scores.numel():
            threshold = torch.topk(scores, self.top_k).values[-1]
            scores = scores.masked_fill(scores < threshold, float("-inf"))
        if self.top_p < 1.0:
            scores = _nucleus(scores, self.top_p)
        probabilities = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probabilities, 1, generator=self.generator))


def _nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the fewest most likely tokens whose probabilities reach top_p (always at least one)."""
    ordered, order = torch.sort(scores, descending=True)
    probabilities = torch.softmax(ordered, dim=-1)
    drop = probabilities.cumsum(dim=-1) - probabilities >= top_p  # the tokens before already reach top_p
    drop[0] = False
    return scores.masked_fill(drop.scatter(0, order, drop), float("-inf"))
