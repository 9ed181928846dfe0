"""Shape buckets, as pure functions shared by live requests and warm-up.

Every tensor the compiled model sees is (batch, seq_len) with seq_len one of the plan's
sequence-length buckets. The requests of one TorchServe batch are sorted by length and split into
groups of one bucket each, so a short request is never padded to the batch's longest one. Where
the batch dimension is dynamic a group keeps its real row count; where it is static the group is
padded with dummy rows up to the next batch bucket. A call holds at most `max_tokens` tokens
(rows x length): the long buckets of a long-context model take fewer rows, so no call, and no
warm-up shape, grows with the square of the limit.
"""

import dataclasses
import itertools

import torch


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    seq_lens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    dynamic: str  # "none", "batch" or "all" (see config.DYNAMIC)
    pack_tokens: int | None = None  # texts packed into rows of at most this many tokens; None: length groups
    max_tokens: int | None = None  # the most tokens (rows x length) one call holds; None: no bound

    @property
    def max_seq_len(self) -> int:
        return self.seq_lens[-1]

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @property
    def full_call_tokens(self) -> int:
        """The tokens of the fullest call: the most rows of the longest row (the pack budget's, else
        the largest length bucket's) within `max_tokens` (`scheduler.call_tokens: auto`)."""
        row = self.pack_tokens or self.max_seq_len
        return self.rows_for(row) * row

    def rows_for(self, seq_len: int) -> int:
        """The most rows a call of this length holds: the largest batch bucket within `max_tokens`
        (at least the smallest)."""
        if self.max_tokens is None:
            return self.max_batch
        fitting = [size for size in self.batch_sizes if size * seq_len <= self.max_tokens]
        return fitting[-1] if fitting else self.batch_sizes[0]


@dataclasses.dataclass(frozen=True)
class Group:
    """Requests (by position) that run together as one (batch_size, seq_len) tensor."""

    indices: tuple[int, ...]
    batch_size: int
    seq_len: int

    @property
    def tokens(self) -> int:
        """Tokens the model computes for the group, padding and dummy rows included."""
        return self.batch_size * self.seq_len


def seq_bucket(length: int, seq_lens: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds `length` tokens, or None when none does."""
    return next((bucket for bucket in seq_lens if bucket >= length), None)


def batch_rows(count: int, plan: BucketPlan) -> int:
    """Rows a group of `count` requests occupies: exact when batch is dynamic, else a bucket."""
    if plan.dynamic != "none":
        return count
    return next(size for size in plan.batch_sizes if size >= count)


def group_requests(lengths: list[int], plan: BucketPlan) -> list[Group]:
    """Split requests into groups of one length bucket and at most `plan.rows_for` that bucket each.

    `lengths` are token counts, each at most `plan.max_seq_len` (overflow is handled before).
    """
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    groups = []
    for seq_len, grouped in itertools.groupby(order, key=lambda index: seq_bucket(lengths[index], plan.seq_lens)):
        members, rows = tuple(grouped), plan.rows_for(seq_len)
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows]
            groups.append(Group(chunk, batch_rows(len(chunk), plan), seq_len))
    return groups


def generation_groups(lengths: list[int], plan: BucketPlan) -> list[Group]:
    """Split prompts into groups of at most `max_batch` that generate together.

    Unlike `group_requests`, a group spans length buckets (padded to its longest prompt's bucket):
    each group costs a whole decode loop, so fewer, fuller groups beat tighter padding.
    """
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    groups = []
    for start in range(0, len(order), plan.max_batch):
        chunk = tuple(order[start : start + plan.max_batch])
        seq_len = seq_bucket(max(lengths[index] for index in chunk), plan.seq_lens)
        groups.append(Group(chunk, batch_rows(len(chunk), plan), seq_len))
    return groups


def warmup_shapes(plan: BucketPlan) -> list[tuple[int, int]]:
    """Every (batch, seq_len) the live path can produce: warm-up runs each of them."""
    return [
        (batch, seq_len) for seq_len in plan.seq_lens for batch in plan.batch_sizes if batch <= plan.rows_for(seq_len)
    ]


def expected_graphs(plan: BucketPlan) -> int:
    """How many graphs dynamo must compile to cover `warmup_shapes(plan)`.

    A dynamic batch covers size 1 too: sizes are compiled size-oblivious (see compiling.py).
    """
    shapes = warmup_shapes(plan)
    if plan.dynamic == "all":
        return 1
    if plan.dynamic == "batch":
        return len({seq_len for _, seq_len in shapes})
    return len(shapes)


def mark_dynamic_dims(tensor: torch.Tensor, dynamic: str) -> None:
    """Tell dynamo which dimensions of a (batch, seq_len) input vary, per the plan's `dynamic`."""
    if dynamic == "none":
        return
    torch._dynamo.mark_dynamic(tensor, 0)
    if dynamic == "all":
        torch._dynamo.mark_dynamic(tensor, 1)


def padded_tokens(groups: list[Group]) -> int:
    """Tokens the model computes for these groups, padding and dummy rows included."""
    return sum(group.tokens for group in groups)
