"""The worker's metrics on Ray: the names handlers/runtime/metrics.py gives, through Ray's metrics API.

Ray exports them on each node's metrics port for Prometheus (with Ray's `ray_` prefix), tagged with
the model's name, the replica, and the counters' extra dimension, so a dashboard built on
TorchServe's names reads them alike.
"""

from ray.util import metrics as ray_metrics

from ts_compiled_handlers.runtime.metrics import COUNTERS, GAUGES, HISTOGRAMS, MetricsSink

# Prometheus' default buckets, as TorchServe's histograms have them (handlers/runtime/metrics.py's units fit them).
BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class RaySink(MetricsSink):
    """A MetricsSink of one replica: each metric made once, at the start."""

    def __init__(self, model_name: str, replica: str):
        self.tags = {"ModelName": model_name, "Replica": replica}
        keys = tuple(self.tags)
        self.gauges = {name: ray_metrics.Gauge(name, tag_keys=keys) for name in GAUGES}
        self.counters = {
            name: ray_metrics.Counter(name, tag_keys=(*keys, dimension)) for name, dimension in COUNTERS.items()
        }
        self.histograms = {
            name: ray_metrics.Histogram(name, boundaries=BOUNDARIES, tag_keys=keys) for name in HISTOGRAMS
        }

    def gauge(self, name: str, value: float, unit: str) -> None:
        self.gauges[name].set(value, self.tags)

    def count(self, name: str, label: str, value: int) -> None:
        self.counters[name].inc(value, {**self.tags, COUNTERS[name]: label})

    def observe(self, name: str, value: float, unit: str) -> None:
        self.histograms[name].observe(value, self.tags)
