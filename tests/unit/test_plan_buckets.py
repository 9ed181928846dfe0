import itertools
import json
import logging
import random
import zipfile

import pytest
import yaml

from ts_compiled_handlers.scripts import build_mar, plan_buckets, plan_costs
from ts_compiled_handlers.worker.traffic_stats import LengthStats, read_histograms


def brute_force(histogram: dict[int, int], k: int, max_len: int, allowed: list[int]) -> int:
    """The least padded tokens over every set of at most k buckets from `allowed`, ending at max_len."""
    others = [value for value in allowed if value < max_len]
    best = None
    for size in range(k):
        for chosen in itertools.combinations(others, size):
            cost = plan_buckets.padded_tokens(histogram, chosen + (max_len,))
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_plan_is_optimal_against_brute_force_over_every_integer(seed):
    rng = random.Random(seed)
    max_len = rng.randint(3, 12)
    histogram = {rng.randint(1, max_len): rng.randint(1, 9) for _ in range(rng.randint(1, 8))}
    k = rng.randint(1, 4)
    chosen = plan_buckets.plan(histogram, k, max_len)
    assert len(chosen) <= k and chosen[-1] == max_len and list(chosen) == sorted(set(chosen))
    expected = brute_force(histogram, k, max_len, list(range(1, max_len + 1)))
    assert plan_buckets.padded_tokens(histogram, chosen) == expected


@pytest.mark.parametrize("seed", range(10))
def test_aligned_plan_is_optimal_among_multiples_of_the_alignment(seed):
    rng = random.Random(100 + seed)
    align, max_len = 4, rng.choice([30, 32, 37])
    histogram = {rng.randint(1, max_len): rng.randint(1, 5) for _ in range(rng.randint(2, 10))}
    chosen = plan_buckets.plan(histogram, 3, max_len, align)
    assert all(value % align == 0 for value in chosen[:-1]) and chosen[-1] == max_len
    allowed = list(range(align, max_len, align)) + [max_len]
    assert plan_buckets.padded_tokens(histogram, chosen) == brute_force(histogram, 3, max_len, allowed)


def test_enough_buckets_mean_no_padding_at_all():
    histogram = {5: 2, 9: 1, 17: 4}
    assert plan_buckets.plan(histogram, 5, 17) == (5, 9, 17)
    assert plan_buckets.padded_tokens(histogram, (5, 9, 17)) == 5 * 2 + 9 + 17 * 4


def test_powers_of_two_are_capped_at_the_largest_bucket():
    assert plan_buckets.doubling(100) == (16, 32, 64, 100)
    assert plan_buckets.doubling(256) == (16, 32, 64, 128, 256)


@pytest.mark.parametrize(
    "text",
    ["5 9 9\n17\n", "[5, 9, 9, 17]", '{"5": 1, "9": 2, "17": 1}'],
)
def test_reads_every_length_format(tmp_path, text):
    path = tmp_path / "lengths"
    path.write_text(text)
    assert plan_buckets.read_lengths(path, None) == {5: 1, 9: 2, 17: 1}


def test_handler_histogram_is_logged_and_read_back(caplog):
    stats = LengthStats("minilm", log_every=3)
    with caplog.at_level(logging.INFO, logger="ts_compiled_handlers.worker.traffic_stats"):
        stats.record([5, 9], padded_tokens=32)
        assert not caplog.records
        stats.record([9, 17], padded_tokens=64)
    assert stats.padded_ratio == pytest.approx(96 / 40)
    prefix = "2026-11-22 12:00:00 [INFO ] W-9000-minilm_1.0-stdout MODEL_LOG - "
    lines = [prefix + record.getMessage() for record in caplog.records]
    other = LengthStats("other", log_every=1)
    other.record([100], 128)
    lines.append("prefix " + "LengthHistogram " + other.log_line())
    second_worker = {"model": "minilm", "worker": -1, "texts": 2, "lengths": {"9": 2}}
    lines.append("prefix LengthHistogram " + json.dumps(second_worker))
    lines.append('prefix LengthHistogram {"model": "minilm", "wor')  # cut short
    assert read_histograms(lines, "minilm") == {5: 1, 9: 4, 17: 1}  # each worker's latest, added up
    assert read_histograms(lines) == {5: 1, 9: 4, 17: 1, 100: 1}


def test_a_batch_over_several_log_points_logs_once_and_moves_on(caplog):
    stats = LengthStats("minilm", log_every=2)
    with caplog.at_level(logging.INFO, logger="ts_compiled_handlers.worker.traffic_stats"):
        stats.record([5] * 5, padded_tokens=80)
        stats.record([5], padded_tokens=16)
    assert [json.loads(r.getMessage().split(" ", 1)[1])["texts"] for r in caplog.records] == [5, 6]


def test_planner_writes_a_plan_that_build_mar_packs(tiny_bert, tmp_path, capsys):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text(" ".join(str(n) for n in [6] * 50 + [12] * 30 + [40] * 5))
    plan_file = tmp_path / "plan.json"
    result = plan_buckets.main(["--lengths", str(lengths), "-k", "3", "--max-len", "64", "--out", str(plan_file)])
    assert result["seq_lens"] == [8, 16, 64]
    out = capsys.readouterr().out
    assert "powers of two" in out
    # The token scheduler's auto call budget follows the plan: 8 rows of the pack budget.
    assert result["call_tokens"] == 8 * result["pack_tokens"] and f"{result['call_tokens']} tokens" in out
    archive = build_mar.main(
        ["--model", str(tiny_bert), "--name", "planned", "--plan", str(plan_file), "--export-path", str(tmp_path)]
    )
    with zipfile.ZipFile(archive) as mar:
        config = yaml.safe_load(mar.read("model-config.yaml"))
    planned = json.loads(plan_file.read_text())
    assert config["handler"]["buckets"]["seq_lens"] == planned["seq_lens"]
    assert config["handler"]["buckets"]["pack_tokens"] == planned["pack_tokens"] in planned["seq_lens"]


def test_the_pack_budget_is_the_bucket_with_the_least_tokens_and_calls():
    # Eight 40-token texts a batch: 256 packs 6 + 2 (a 256-row and a 128-row: two calls), 128 packs
    # 3 + 3 + 2 (three 128-rows: one call), 64 and less one text a row (eight 64-rows).
    budget, rows = plan_buckets.plan_pack_budget({40: 10}, (16, 32, 64, 128, 256), batch=8)
    figures = {row["pack_tokens"]: (row["padded_ratio"], row["calls_per_batch"]) for row in rows}
    assert figures == {16: (1.6, 1.0), 32: (1.6, 1.0), 64: (1.6, 1.0), 128: (1.2, 1.0), 256: (1.2, 2.0)}
    assert budget == 128


def test_measured_attention_costs_weigh_long_rows_more_than_their_tokens():
    histogram = {20: 50, 60: 30, 300: 10, 900: 5}
    free = plan_costs.Costs()
    quadratic = plan_costs.Costs(per_call=78, per_square=0.01, measured=True)
    assert quadratic.row(1024) > 10 * free.row(1024) and quadratic.call(2, 16) > free.call(2, 16) - 1
    seq_lens = plan_buckets.plan(histogram, 4, 1024, 8)
    budget, rows = plan_buckets.plan_pack_budget(histogram, seq_lens, 8, free)
    assert budget <= 256 and all(row["pack_tokens"] <= 256 for row in rows)  # assumed costs: up to AUTO_BUDGET
    budget, rows = plan_buckets.plan_pack_budget(histogram, seq_lens, 8, quadratic)
    assert {row["pack_tokens"] for row in rows} == set(seq_lens)  # measured: every bucket is a candidate
    costs = {row["pack_tokens"]: row["cost_per_real_token"] for row in rows}
    assert costs[budget] == min(costs.values()) and budget < max(seq_lens)  # a long row's attention does not pay


def test_costs_are_fitted_from_timings_and_measured_on_the_model(tiny_models):
    samples = [(rows, length, 0.001 + 1e-5 * rows * length * (1 + 0.002 * length)) for rows, length in
               plan_costs.shapes(512, 4096)]  # fmt: skip
    fitted = plan_costs.fit(samples)
    assert fitted.measured and fitted.per_call == pytest.approx(100, rel=1e-3)
    assert fitted.per_square == pytest.approx(0.002, rel=1e-3)
    measured, timed = plan_costs.measure(tiny_models["embedding-long"], "embedding", repeats=1)
    assert measured.measured and len(timed) == len(plan_costs.shapes(512, 4096)) == 12
    assert all(seconds > 0 for _, _, seconds in timed) and measured.per_call >= 0 and measured.per_square >= 0
