"""Repeated texts answered from the cache of rows (handlers/worker/row_cache.py, `handler.cache_bytes`):
each distinct text computed once, answers identical to the first computation's, within the bound."""

import pytest
import torch
from fakes import answered, ready_handler

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.configuration.config_values import ConfigError
from ts_compiled_handlers.runtime.metrics import MetricsSink
from ts_compiled_handlers.worker.row_cache import RowCache

EAGER = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}, "compile": {"enable": False}}


class Computer:
    """`compute` for a RowCache: a row per text (its ids as floats), the texts it was asked for kept."""

    def __init__(self):
        self.asked: list[list[int]] = []

    def __call__(self, token_ids, type_ids, adapters=None):
        self.asked.extend(token_ids)
        whole = torch.tensor([[float(sum(ids)), float(len(ids))] for ids in token_ids])
        return list(whole.unbind(0))  # views of one output, as the engine's rows are


def test_a_repeat_is_computed_once_in_a_call_and_never_again_while_it_fits():
    cache, compute = RowCache(1000), Computer()
    rows, found = cache.rows_for([[1, 2], [3], [1, 2]], None, compute)
    assert compute.asked == [[1, 2], [3]] and found == 1  # the repeat within the call
    assert rows[0] is rows[2] and rows[0].tolist() == [3.0, 2.0]
    rows, found = cache.rows_for([[3], [4, 4], [1, 2]], None, compute)
    assert compute.asked[2:] == [[4, 4]] and found == 2
    assert [row.tolist() for row in rows] == [[3.0, 1.0], [8.0, 2.0], [3.0, 2.0]]
    assert cache.bytes == 3 * 2 * 4  # three rows of two float32, each its own copy (not its call's view)
    assert all(row.untyped_storage().nbytes() == 8 for row in cache.rows.values())


def test_token_types_are_part_of_the_key():
    cache, compute = RowCache(1000), Computer()
    cache.rows_for([[1, 2]], [[0, 0]], compute)
    cache.rows_for([[1, 2], [1, 2]], [[0, 1], [0, 0]], compute)
    assert compute.asked == [[1, 2], [1, 2]]  # the pair with other types is another text


def test_the_least_recently_used_rows_go_first_and_the_bytes_stay_within_the_bound():
    cache, compute = RowCache(3 * 8), Computer()  # three rows of 8 bytes
    cache.rows_for([[1], [2], [3]], None, compute)
    cache.rows_for([[1]], None, compute)  # used again: [2] is now the oldest
    cache.rows_for([[4]], None, compute)
    assert list(cache.rows) == [((3,), None, 0), ((1,), None, 0), ((4,), None, 0)] and cache.bytes == 24
    cache.rows_for([[2], [1]], None, compute)
    assert compute.asked[-1:] == [[2]] and cache.bytes <= 24
    large = RowCache(4)  # a row larger than the whole bound is answered, not kept
    rows, _ = large.rows_for([[9]], None, Computer())
    assert rows[0].tolist() == [9.0, 1.0] and not large.rows and large.bytes == 0


def test_the_key_is_checked_and_refused_for_generation():
    assert parse({"handler": {"cache_bytes": 2**20}}).cache_bytes == 2**20 and parse({}).cache_bytes == 0
    with pytest.raises(ConfigError, match="cache_bytes"):
        parse({"handler": {"cache_bytes": -1}})
    with pytest.raises(ConfigError, match="the cache serves encoders"):
        parse({"handler": {"task": "text-generation", "cache_bytes": 2**20}})


class Counted(MetricsSink):
    def __init__(self):
        self.counts, self.gauges = {}, {}

    def count(self, name, label, value):
        self.counts[name, label] = self.counts.get((name, label), 0) + value

    def gauge(self, name, value, unit):
        self.gauges[name] = value


@pytest.mark.parametrize("task", ["embedding", "text-classification"])
def test_a_served_repeat_gets_the_answer_its_first_computation_got_whatever_the_parameters(tiny_models, task):
    cached = ready_handler(task, tiny_models[task], cache_bytes=2**20, **EAGER)
    plain = ready_handler(task, tiny_models[task], **EAGER)
    counted = Counted()
    object.__setattr__(cached.worker, "metrics", counted)  # the worker's sink, as a server's would count
    computed = []
    engine = cached.worker.engine
    run = engine.run
    object.__setattr__(
        engine, "run", lambda token_ids, **options: computed.extend(token_ids) or run(token_ids, **options)
    )
    texts = ["alice walks to paris", "the cat sat on the mat", "alice walks to paris"]
    first = answered(cached, [{"inputs": texts}])[0]
    assert first[0] == first[2] and len(computed) == 2
    extra = {"normalize": False} if task == "embedding" else {"top_k": 2}
    again = answered(cached, [{"inputs": texts[:2], **extra}, {"inputs": texts[1]}])
    assert len(computed) == 2  # nothing computed again: every parameter acts after the model
    assert again[1] == first[1]
    expected = answered(plain, [{"inputs": texts[:2], **extra}])[0]
    for got, want in zip(again[0], expected, strict=True):  # as the uncached worker answers them
        assert labels(got) == labels(want)
        torch.testing.assert_close(torch.tensor(numbers(got)), torch.tensor(numbers(want)))
    cache_counts = {label: value for (name, label), value in counted.counts.items() if name == "CachedTexts"}
    assert cache_counts == {"hit": 4, "miss": 2}
    assert sum(value for (name, _), value in counted.counts.items() if name == "BucketRequests") == 2
    assert 0 < counted.gauges["CacheBytes"] <= 2**20


def numbers(answer) -> list[float]:
    """An embedding's values, or a classifier's scores, for comparing within float noise."""
    return answer["embedding"] if isinstance(answer, dict) else [item["score"] for item in answer]


def labels(answer) -> list[str] | None:
    return None if isinstance(answer, dict) else [item["label"] for item in answer]
