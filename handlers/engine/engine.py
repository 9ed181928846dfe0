"""The engine: the model as it serves, built once at `initialize` (handlers/startup/build_steps.py), never
changed after.

It holds the model behind one interface (compiled, AOT package or eager: handlers/engine/runner.py),
its layout (packed rows or length groups, handlers/engine/layout.py), the bucket plan and the dtype, and
has one way to run the model: `run(token_ids)`, tokenized texts in, one output row per text out.
The request path, warm-up, the compiled-vs-eager and dtype checks, the AOT build, the planner's
shapes and the benchmarks all go through it; a check that needs another model or layout runs an
engine made with `dataclasses.replace`.
"""

import dataclasses

import torch

from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.engine.layout import BatchIds, Call, Layout, prepare_call
from ts_compiled_handlers.engine.runner import ModelRunner


@dataclasses.dataclass(frozen=True)
class KeptPart:
    """The part of a text's (tokens, values) output row its answer reads, copied out of its call's
    output as each call ends, so that a request holds only that part until it is answered: the
    first token's values only (`first_token`), and the first `columns` values (None: all)."""

    first_token: bool = False
    columns: int | None = None

    def __call__(self, row: torch.Tensor) -> torch.Tensor:
        part = row[:1] if self.first_token else row
        return (part if self.columns is None else part[:, : self.columns]).clone()

    def held_bytes(self, token_ids: list[list[int]], row_values: int) -> int:
        """What the part of each of these texts' float32 rows takes, of `row_values` per token."""
        tokens = len(token_ids) if self.first_token else sum(len(ids) for ids in token_ids)
        return tokens * (row_values if self.columns is None else self.columns) * 4


@dataclasses.dataclass(frozen=True)
class Outputs:
    """One output row per text, in order (per-token tasks: a (tokens, ...) row), the texts' token
    counts, and the calls made."""

    rows: list[torch.Tensor]
    lengths: list[int]
    calls: list[Call]


class OnModel:
    """An engine (a frozen dataclass with a `model`) that can run another model of the same shapes."""

    def on(self, model: ModelRunner):
        """This engine over another model (a check's eager reference, a benchmark's contender)."""
        return dataclasses.replace(self, model=model)


@dataclasses.dataclass(frozen=True)
class Engine(OnModel):
    model: ModelRunner
    layout: Layout
    plan: buckets.BucketPlan
    dtype: torch.dtype
    device: torch.device
    pad_id: int
    per_token: bool = False  # outputs per token (token classification), not per text

    def run(
        self, token_ids: list[list[int]], one_per_row: bool = False, type_ids=None, adapters=None, kept=None
    ) -> Outputs:
        """The model over tokenized texts, in the calls the layout makes of them (`one_per_row`:
        each text in a row of its own, as warm-up reaches each shape of the grid; `type_ids`: each
        token's type, for text pairs, where the layout has them; zeros otherwise; `adapters`: each
        text's adapter id, where the layout serves adapters; none otherwise; `kept`: each text's
        KeptPart, or None for its whole row, where a per-token task's answers read less)."""
        ids = BatchIds(token_ids, type_ids, adapters)
        calls = self.layout.calls(ids.lengths, self.plan, one_per_row)
        rows: list[torch.Tensor | None] = [None] * len(token_ids)
        with torch.inference_mode():
            for call in calls:
                prepared = prepare_call(ids, call, self.layout, self.pad_id, self.per_token, self.device)
                output = self.model(prepared.inputs)
                picked = output[prepared.pick].float().cpu()
                pieces = picked.split(prepared.lengths) if self.per_token else picked.unbind(0)
                for text, piece in zip(prepared.texts, pieces, strict=True):
                    rows[text] = piece if kept is None or kept[text] is None else kept[text](piece)
        return Outputs(rows, ids.lengths, calls)
