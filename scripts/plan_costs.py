"""What a model call costs, for the planner: per call, per token, and attention's part that grows
with the row's length, measured on the model itself or assumed.

A call of `rows` rows of `length` tokens takes about

    per_call + rows x length x (1 + per_square x length)        (in the time of one computed token)

Short rows cost their tokens; long ones also their attention, quadratic in the length, so a
long-context model's pack budget and largest buckets are chosen by what they really cost.
`measure` fits the three terms by least squares on the eager model over its length buckets.
"""

import dataclasses
import statistics
import time
from pathlib import Path

import numpy as np

# A model call's fixed cost in computed tokens: benchmarks/benchmark_traffic.py fits a batch's time as
# calls x per call + tokens x per token; MiniLM's packed rows on 2 CPU cores gave 78 (docs/design.md, "Packing").
CALL_TOKENS = 78
SMALLEST = 16


@dataclasses.dataclass(frozen=True)
class Costs:
    per_call: float = CALL_TOKENS
    per_square: float = 0.0  # per token and token of its row: attention (0: assumed free)
    measured: bool = False

    def row(self, length: int) -> float:
        """One row of `length` tokens, in computed tokens."""
        return length * (1 + self.per_square * length)

    def call(self, rows: int, length: int) -> float:
        return self.per_call + rows * self.row(length)


def shapes(limit: int, max_tokens: int) -> list[tuple[int, int]]:
    """(rows, length) to time: every doubling length up to `limit`, one row and a full call."""
    found, length = [], SMALLEST
    while True:
        length = min(length, limit)
        found += sorted({(1, length), (max(1, max_tokens // length), length)})
        if length == limit:
            return found
        length *= 2


def fit(samples: list[tuple[int, int, float]]) -> Costs:
    """Least squares of seconds ~ a + b x tokens + c x tokens x length, as a `Costs` in b's unit."""
    design = np.array([[1.0, rows * length, rows * length * length] for rows, length, _ in samples])
    per_call, per_token, per_square = np.linalg.lstsq(design, np.array([s for *_, s in samples]), rcond=None)[0]
    per_token = max(per_token, 1e-12)
    return Costs(max(per_call, 0.0) / per_token, max(per_square, 0.0) / per_token, measured=True)


def measure(model_dir: Path, task: str, max_tokens: int = 4096, repeats: int = 3) -> tuple[Costs, list]:
    """Time the model eagerly (the attention's share is a property of the model, compiled or not) over
    its length buckets, and fit the costs; also the samples (rows, length, seconds)."""
    from ts_compiled_handlers.benchmarks.in_process import ready_handler

    handler = ready_handler(task, model_dir, compile={"enable": False}, buckets={"pack_tokens": "off"})
    engine, filler = handler.engine, handler.serving.probes.filler
    samples = []
    for rows, length in shapes(engine.plan.max_seq_len, max_tokens):
        ids = filler(length, rows)
        engine.run(ids, one_per_row=True)  # warm
        timings = []
        for _ in range(repeats):
            began = time.perf_counter()
            engine.run(ids, one_per_row=True)
            timings.append(time.perf_counter() - began)
        samples.append((rows, length, statistics.median(timings)))
    return fit(samples), samples
