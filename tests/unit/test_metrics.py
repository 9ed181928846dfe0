"""The metrics our handlers emit are declared in handlers/servers/torchserve/metrics.yaml, or TorchServe drops them."""

from types import SimpleNamespace

import torch
import yaml
from fakes import RecordingMetrics

from ts_compiled_handlers.engine.buckets import Group
from ts_compiled_handlers.runtime import metrics, package_files

DECLARED = yaml.safe_load((package_files.TORCHSERVE_FILES / "metrics.yaml").read_text())["model_metrics"]


def declared(kind: str) -> dict[str, list[str]]:
    return {entry["name"]: entry["dimensions"] for entry in DECLARED[kind]}


def test_every_gauge_counter_and_histogram_is_declared_with_the_dimensions_it_is_emitted_with():
    for name in metrics.GAUGES:
        assert declared("gauge")[name] == ["ModelName", "Level"], name
    for name, extra in metrics.COUNTERS.items():
        assert declared("counter")[name] == ["ModelName", "Level", extra], name
    for name in metrics.HISTOGRAMS:
        assert declared("histogram")[name] == ["ModelName", "Level"], name


def test_texts_are_counted_per_bucket_of_each_group():
    from ts_compiled_handlers.engine.buckets import BucketPlan
    from ts_compiled_handlers.engine.engine import Engine
    from ts_compiled_handlers.engine.layout import Call, Layout
    from ts_compiled_handlers.engine.runner import EagerRunner
    from ts_compiled_handlers.servers.torchserve.metrics_sink import TorchServeSink
    from ts_compiled_handlers.worker.traffic_stats import LengthStats
    from ts_compiled_handlers.worker.worker import Worker

    recorded = RecordingMetrics()
    plan = BucketPlan((8, 32), (1, 2), "all")
    engine = Engine(EagerRunner(torch.nn.Identity()), Layout(), plan, torch.float32, torch.device("cpu"), 0)
    sink = TorchServeSink(SimpleNamespace(model_name="m", metrics=recorded))
    worker = SimpleNamespace(engine=engine, lengths=LengthStats("m"), metrics=sink)
    worker.report_recompiles = lambda: Worker.report_recompiles(worker)
    calls = [Call(Group((0, 1), 2, 8), ((0,), (1,))), Call(Group((2,), 1, 32), ((2,),))]
    Worker.record_traffic(worker, [3, 5, 20], calls)  # warm-up: not traffic
    assert [call[0] for call in recorded.calls] == ["RecompilesAfterReady"]
    engine.model.mark_ready()
    Worker.record_traffic(worker, [3, 5, 20], calls)
    counted = [call for call in recorded.calls if call[0] == "BucketRequests"]
    assert [(value, dims["Bucket"], kind) for _, value, dims, kind in counted] == [
        (2, "2x8", "COUNTER"),
        (1, "1x32", "COUNTER"),
    ]


def test_a_gauge_is_written_when_its_value_changes_only():
    from ts_compiled_handlers.servers.torchserve.metrics_sink import TorchServeSink

    recorded = RecordingMetrics()
    sink = TorchServeSink(SimpleNamespace(model_name="m", metrics=recorded))
    for value in (0, 0, 0, 1, 1, 0):  # RecompilesAfterReady after every call
        sink.gauge("RecompilesAfterReady", value, "Count")
    sink.gauge("PaddedTokenRatio", 0, "Ratio")  # another gauge's value is its own
    written = [(name, value) for name, value, _, _ in recorded.calls]
    assert written == [("RecompilesAfterReady", 0), ("RecompilesAfterReady", 1), ("RecompilesAfterReady", 0),
                       ("PaddedTokenRatio", 0)]  # fmt: skip
