"""Warm-up before the worker takes traffic: every shape of the grid, timed and checked.

Warm-up runs the engine's own `run` (handlers/engine/engine.py), the path live requests take after
tokenization (layout, padding, tensor creation under the same grad mode), so dynamo's guards see
identical inputs and the first live batch compiles nothing. `Probes` makes the synthetic token ids
that warm-up and every check (compiled vs eager, `dtype: auto`, packed vs alone, AOT) run.
"""

import dataclasses
import logging
import math
import time
from typing import Callable

import torch

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.engine import buckets

logger = logging.getLogger(__name__)

# Outputs are compared by 1 - cosine similarity per row; these bound that drift per dtype.
AUTO_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-3, torch.float16: 2e-3}


class WarmupError(RuntimeError):
    """Compiled outputs or graph counts that the handler must not serve."""


@dataclasses.dataclass(frozen=True)
class WarmupReport:
    shapes: int
    graphs: int
    compile_seconds: float
    warmup_seconds: float


def filler_ids(length: int, rows: int, vocab_size: int, special: tuple[int, int], seed: int = 0) -> list[list[int]]:
    """`rows` token-id lists of `length` tokens: first/last special ids around seeded random ids."""
    generator = torch.Generator().manual_seed(seed + length)
    first, last = special
    body = torch.randint(vocab_size // 4, vocab_size, (rows, max(0, length - 2)), generator=generator)
    return [([first] + row + [last])[:length] for row in body.tolist()]


class Probes:
    """Synthetic token ids over a plan's grid, framed by the tokenizer's own first and last ids."""

    def __init__(self, tokenizer, plan: buckets.BucketPlan):
        ids = tokenizer("x")["input_ids"]
        self.special = (ids[0], ids[-1])
        self.vocab_size = len(tokenizer)
        self.plan = plan

    def filler(self, seq_len: int, rows: int) -> list[list[int]]:
        """`rows` texts of exactly `seq_len` tokens."""
        return filler_ids(seq_len, rows, self.vocab_size, self.special)

    def check_rows(self) -> list[list[int]]:
        """Two rows per length bucket, one full and one shorter, for compiled-vs-eager checks."""
        plan = self.plan
        rows = plan.batch_sizes[min(1, len(plan.batch_sizes) - 1)]
        probe = []
        for previous, seq_len in zip((1,) + plan.seq_lens, plan.seq_lens, strict=False):
            lengths = [seq_len] + [max(previous + 1, 2)] * (rows - 1)
            probe += [self.filler(length, 1)[0] for length in lengths]
        return probe

    def package_rows(self) -> list[list[int]]:
        """The check rows of the smallest and the largest length bucket (an AOT package's reference)."""
        probe = self.check_rows()
        rows = len(probe) // len(self.plan.seq_lens)
        return probe[:rows] + probe[-rows:]


def tolerance(configured: float | None, dtype: torch.dtype) -> float:
    """The largest allowed 1 - cosine: `warmup.tolerance`, or the dtype's own (AUTO_TOLERANCE)."""
    return configured or AUTO_TOLERANCE[dtype]


def padding_variants(token_ids: list[list[int]], shorter_fits: bool) -> list[list[list[int]]]:
    """The rows as given (no padding) and, where a shorter row stays in the bucket, with padding.

    A batch without padding may reach a model's blocks with no attention mask at all (transformers
    drops an all-ones mask outside compiled code), so both kinds must be compiled before ready.
    """
    if not shorter_fits:
        return [token_ids]
    return [token_ids, token_ids[:-1] + [token_ids[-1][:-1]]]


def run_grid(
    engine,
    iterations: int,
    make_ids: Callable[[int, int], list[list[int]]],
    graphs_needed: int | None,
    progress: Callable[[int, int], None] | None = None,
) -> WarmupReport:
    """Run the engine (handlers/engine/engine.py) at every (batch, seq_len) of its plan `iterations` times,
    each text in a row of its own; check the compiled graph count.

    `graphs_needed` is what the grid must compile per graph of one shape (None: do not check);
    `progress(done, total)` is called after each shape.
    """
    plan = engine.plan
    start = time.perf_counter()
    graphs_before = compiled_graph_count()
    first_calls = 0.0
    graphs_per_shape = None
    shapes = buckets.warmup_shapes(plan)
    if progress is not None:
        progress(0, len(shapes))  # the first shape compiles: most of the wait is before it is done
    for done, (batch, seq_len) in enumerate(shapes, start=1):
        previous = max([length for length in plan.seq_lens if length < seq_len], default=0)
        for token_ids in padding_variants(make_ids(seq_len, batch), seq_len - 1 > previous):
            began = time.perf_counter()
            engine.run(token_ids, one_per_row=True)
            first_calls += time.perf_counter() - began
            for _ in range(iterations - 1):
                engine.run(token_ids, one_per_row=True)
        if graphs_per_shape is None:
            # More than one graph per shape means graph breaks; the grid multiplies them.
            graphs_per_shape = max(1, compiled_graph_count() - graphs_before)
        if progress is not None:
            progress(done, len(shapes))
    report = WarmupReport(len(shapes), compiled_graph_count() - graphs_before, first_calls, time.perf_counter() - start)
    if graphs_needed is not None:
        _check_graph_count(report.graphs, graphs_needed * graphs_per_shape, plan)
    return report


def _check_graph_count(graphs: int, expected: int, plan: buckets.BucketPlan) -> None:
    """`expected` graphs, or twice that where a dynamic batch includes size 1 and the model's code
    still gives size 1 graphs of their own (dynamo's 0/1 specialization, which size-oblivious
    sizes do not remove for every model: Qwen3's attention under inductor, say). Warm-up ran both,
    so no live call compiles either way; anything else means graphs the plan cannot account for."""
    batch_one_apart = plan.dynamic != "none" and 1 in plan.batch_sizes and graphs == 2 * expected
    if batch_one_apart:
        logger.info("Batch size 1 has graphs of its own (%d in all): this model specializes it", graphs)
    elif graphs != expected:
        raise WarmupError(
            f"warm-up compiled {graphs} graphs but the bucket plan needs {expected} "
            f"(dynamic={plan.dynamic}, {len(plan.seq_lens)} lengths x {len(plan.batch_sizes)} batch sizes); "
            "a shape was specialized that the plan marks dynamic"
        )


def drift(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """1 - the smallest cosine similarity between matching output rows (0 means identical; infinity
    where a row holds NaN or infinity, which would otherwise slip past every comparison)."""
    worst = 0.0
    for got, want in zip(outputs, reference, strict=True):
        cosine = torch.nn.functional.cosine_similarity(got.float().flatten(), want.float().flatten(), dim=0).item()
        worst = max(worst, 1.0 - cosine if math.isfinite(cosine) else math.inf)
    return worst


def check_error(name: str, outputs: list[torch.Tensor], reference: list[torch.Tensor], tolerance: float) -> float:
    """The largest absolute difference relative to the reference's largest value, checked: cosine
    alone passes a row of one or two logits whose signs agree, whatever their sizes."""
    ratios = [
        (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)
        for got, want in zip(outputs, reference, strict=True)
    ]
    measured = max(math.inf if math.isnan(ratio) else ratio for ratio in ratios)  # max() would skip a NaN
    if measured > tolerance:
        raise WarmupError(f"{name}: outputs differ by {measured:.2e} of their size, tolerance {tolerance:.0e}")
    return measured


def check_drift(name: str, outputs: list[torch.Tensor], reference: list[torch.Tensor], tolerance: float) -> float:
    measured = drift(outputs, reference)
    if measured > tolerance:
        raise WarmupError(f"{name}: outputs drift {measured:.2e} from the reference, tolerance {tolerance:.0e}")
    logger.info("%s: drift %.2e within tolerance %.0e", name, measured, tolerance)
    return measured
