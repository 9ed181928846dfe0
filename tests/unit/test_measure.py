import pytest
import torch

from ts_compiled_handlers.benchmarks import measure


def test_percentile_is_nearest_rank():
    samples = list(range(1, 101))
    assert measure.percentile(samples, 0.50) == 50
    assert measure.percentile(samples, 0.99) == 99
    assert measure.percentile(samples, 1.0) == 100
    assert measure.percentile([7.0], 0.99) == 7.0


def test_summary_of_known_samples():
    summary = measure.summarize([1.0, 2.0, 3.0, 4.0])
    assert summary["median"] == 2.5
    assert summary["mean"] == 2.5
    assert summary["std"] == pytest.approx(1.118034, rel=1e-6)
    assert summary["cv"] == pytest.approx(0.4472136, rel=1e-6)
    assert summary["noisy"] is True
    assert summary["count"] == 4


def test_steady_samples_are_not_noisy():
    summary = measure.summarize([1.00, 1.01, 0.99, 1.00] * 20)
    assert summary["noisy"] is False
    assert summary["p99"] == 1.01


def test_time_calls_runs_warmup_then_timed_calls():
    calls = []
    samples = measure.time_calls(lambda: calls.append(1), warmup=3, iterations=5, device=torch.device("cpu"))
    assert len(calls) == 8 and len(samples) == 5 and all(sample >= 0 for sample in samples)


def test_time_calls_synchronizes_cuda_before_each_clock_read(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    measure.time_calls(lambda: None, warmup=1, iterations=4, device=torch.device("cuda", 0))
    assert len(synced) == 5  # once after the warm-up, once per timed call


def test_interleaved_timing_alternates_contenders():
    order = []
    calls = {"eager": lambda: order.append("e"), "compiled": lambda: order.append("c")}
    samples = measure.time_interleaved(calls, warmup=2, iterations=3, device=torch.device("cpu"))
    assert order == ["e", "e", "c", "c"] + ["e", "c"] * 3
    assert [len(values) for values in samples.values()] == [3, 3]
