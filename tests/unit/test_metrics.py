"""The metrics our handlers emit are declared in handlers/metrics.yaml, or TorchServe drops them."""

from pathlib import Path

import torch
import yaml
from fakes import RecordingMetrics

from ts_compiled_handlers import metrics
from ts_compiled_handlers.buckets import Group

DECLARED = yaml.safe_load((Path(metrics.__file__).parent / "metrics.yaml").read_text())["model_metrics"]


def declared(kind: str) -> dict[str, list[str]]:
    return {entry["name"]: entry["dimensions"] for entry in DECLARED[kind]}


def test_every_gauge_counter_and_histogram_is_declared_with_the_dimensions_it_is_emitted_with():
    for name in metrics.GAUGES:
        assert declared("gauge")[name] == ["ModelName", "Level"], name
    for name, extra in metrics.COUNTERS.items():
        assert declared("counter")[name] == ["ModelName", "Level", extra], name
    for name in metrics.HISTOGRAMS:
        assert declared("histogram")[name] == ["ModelName", "Level"], name


class Context:
    model_name = "m"

    def __init__(self):
        self.metrics = RecordingMetrics()


def test_texts_are_counted_per_bucket_of_each_group():
    from ts_compiled_handlers.base import CompiledHandler
    from ts_compiled_handlers.buckets import BucketPlan
    from ts_compiled_handlers.engine import Engine
    from ts_compiled_handlers.layout import Call, Layout
    from ts_compiled_handlers.length_stats import LengthStats
    from ts_compiled_handlers.model_runner import EagerRunner

    handler = CompiledHandler()
    handler.context, handler.lengths, handler.initialized = Context(), LengthStats("m"), True
    plan = BucketPlan((8, 32), (1, 2), "all")
    handler.engine = Engine(EagerRunner(torch.nn.Identity()), Layout(), plan, torch.float32, torch.device("cpu"), 0)
    calls = [Call(Group((0, 1), 2, 8), ((0,), (1,))), Call(Group((2,), 1, 32), ((2,),))]
    handler.record_traffic([3, 5, 20], calls)  # warm-up: not traffic
    assert handler.context.metrics.calls == []
    handler.engine.model.mark_ready()
    handler.record_traffic([3, 5, 20], calls)
    counted = [call for call in handler.context.metrics.calls if call[0] == "BucketRequests"]
    assert [(value, dims["Bucket"], kind) for _, value, dims, kind in counted] == [
        (2, "2x8", "COUNTER"),
        (1, "1x32", "COUNTER"),
    ]
