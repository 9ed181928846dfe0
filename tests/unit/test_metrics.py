"""The metrics our handlers emit are declared in handlers/metrics.yaml, or TorchServe drops them."""

from pathlib import Path

import torch
import yaml
from fakes import RecordingMetrics

from handlers import metrics
from handlers.buckets import Group

DECLARED = yaml.safe_load((Path(metrics.__file__).parent / "metrics.yaml").read_text())["model_metrics"]


def declared(kind: str) -> dict[str, list[str]]:
    return {entry["name"]: entry["dimensions"] for entry in DECLARED[kind]}


def test_every_gauge_and_counter_is_declared_with_the_dimensions_it_is_emitted_with():
    for name in metrics.GAUGES:
        assert declared("gauge")[name] == ["ModelName", "Level"], name
    for name, extra in metrics.COUNTERS.items():
        assert declared("counter")[name] == ["ModelName", "Level", extra], name


class Context:
    model_name = "m"

    def __init__(self):
        self.metrics = RecordingMetrics()


def test_texts_are_counted_per_bucket_of_each_group():
    from handlers.base import CompiledHandler, run_eager
    from handlers.length_stats import LengthStats

    handler = CompiledHandler()
    handler.context, handler.lengths = Context(), LengthStats("m")
    handler.model = run_eager(torch.nn.Identity())
    handler.record_padding([3, 5, 20], [Group((0, 1), 2, 8), Group((2,), 1, 32)])  # warm-up: not traffic
    assert handler.context.metrics.calls == []
    handler.model.mark_ready()
    handler.record_padding([3, 5, 20], [Group((0, 1), 2, 8), Group((2,), 1, 32)])
    counted = [call for call in handler.context.metrics.calls if call[0] == "BucketRequests"]
    assert [(value, dims["Bucket"], kind) for _, value, dims, kind in counted] == [
        (2, "2x8", "COUNTER"),
        (1, "1x32", "COUNTER"),
    ]
