import random

import pytest

from ts_compiled_handlers.engine import buckets

PLANS = [buckets.BucketPlan((16, 32, 64, 128, 256), (1, 2, 4, 8), dynamic) for dynamic in ("none", "batch", "all")]


def test_seq_bucket_is_the_smallest_that_fits():
    assert buckets.seq_bucket(1, (16, 32)) == 16
    assert buckets.seq_bucket(16, (16, 32)) == 16
    assert buckets.seq_bucket(17, (16, 32)) == 32
    assert buckets.seq_bucket(33, (16, 32)) is None


@pytest.mark.parametrize("plan", PLANS, ids=lambda plan: plan.dynamic)
def test_groups_cover_every_request_once_within_bucket_and_batch_limits(plan):
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(2, plan.max_seq_len) for _ in range(rng.randint(1, 20))]
        groups = buckets.group_requests(lengths, plan)
        members = sorted(index for group in groups for index in group.indices)
        assert members == list(range(len(lengths)))
        for group in groups:
            assert group.seq_len in plan.seq_lens
            assert all(lengths[i] <= group.seq_len for i in group.indices)
            assert all(buckets.seq_bucket(lengths[i], plan.seq_lens) == group.seq_len for i in group.indices)
            assert len(group.indices) <= group.batch_size <= plan.max_batch
            assert (group.batch_size, group.seq_len) in buckets.warmup_shapes(plan) or plan.dynamic != "none"


def test_static_batch_pads_rows_up_to_a_batch_bucket_dynamic_does_not():
    static, dynamic = PLANS[0], PLANS[2]
    assert [g.batch_size for g in buckets.group_requests([10, 11, 12], static)] == [4]
    assert [g.batch_size for g in buckets.group_requests([10, 11, 12], dynamic)] == [3]


def test_grouping_pads_fewer_tokens_than_padding_the_batch_to_its_longest():
    lengths = [8, 9, 10, 12, 14, 15, 200, 9]
    groups = buckets.group_requests(lengths, PLANS[2])
    assert buckets.padded_tokens(groups) == 7 * 16 + 256
    assert buckets.padded_tokens(groups) < len(lengths) * max(lengths)


def test_warmup_shapes_cover_the_whole_plan():
    plan = PLANS[0]
    shapes = buckets.warmup_shapes(plan)
    assert len(shapes) == len(set(shapes)) == len(plan.seq_lens) * len(plan.batch_sizes)
    assert {seq for _, seq in shapes} == set(plan.seq_lens)
    assert {batch for batch, _ in shapes} == set(plan.batch_sizes)


def test_expected_graphs_per_strategy():
    assert [buckets.expected_graphs(plan) for plan in PLANS] == [20, 5, 1]  # batch 1 shares the dynamic graph
    assert buckets.expected_graphs(buckets.BucketPlan((16,), (2, 4), "all")) == 1
    assert buckets.expected_graphs(buckets.BucketPlan((16, 32), (1,), "batch")) == 2


def test_long_buckets_take_fewer_rows_so_no_call_holds_more_than_max_tokens():
    plan = buckets.BucketPlan((16, 256, 512, 1024, 8192), (1, 2, 4, 8), "all", max_tokens=4096)
    assert [plan.rows_for(seq_len) for seq_len in plan.seq_lens] == [8, 8, 8, 4, 1]
    shapes = buckets.warmup_shapes(plan)
    assert max(batch * seq_len for batch, seq_len in shapes) == 8192  # one row of the limit, never more
    assert (2, 8192) not in shapes and (4, 1024) in shapes and (8, 1024) not in shapes
    groups = buckets.group_requests([900] * 9 + [5000] * 3, plan)
    assert [(group.batch_size, group.seq_len) for group in groups] == [(4, 1024)] * 2 + [(1, 1024)] + [(1, 8192)] * 3
    assert all((group.batch_size, group.seq_len) in shapes for group in groups)
    static = buckets.BucketPlan((512, 8192), (1, 2, 4, 8), "none", max_tokens=4096)
    assert buckets.expected_graphs(static) == len(buckets.warmup_shapes(static)) == 5  # 4 at 512, 1 at 8192
