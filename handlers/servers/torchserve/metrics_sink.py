"""The worker's metrics on TorchServe: model-level metrics through the worker's metrics cache.

They reach the metrics API only because `handlers/servers/torchserve/metrics.yaml` (the file `metrics_config` in
config.properties points to) declares them with the same names and dimensions.
"""

from ts.metrics.dimension import Dimension
from ts.metrics.metric_cache_errors import MetricsCacheKeyError
from ts.metrics.metric_type_enum import MetricTypes

from ts_compiled_handlers.runtime.metrics import COUNTERS, MetricsSink


class TorchServeSink(MetricsSink):
    """A MetricsSink writing to the metrics cache of the worker's context (`context.metrics`, read
    at each call; a context without one, as in process, keeps nothing). The context is the one
    `initialize` got: TorchServe's sync worker passes that same object to every `handle`, and its
    cache writes each metric as a log line the frontend reads at once, so a gauge is written only
    when its value changes (the frontend keeps the last one): RecompilesAfterReady, set after every
    call, stays one line while it stays 0."""

    def __init__(self, context):
        self.context = context
        self.dimensions = [Dimension("ModelName", context.model_name), Dimension("Level", "Model")]
        self.gauges = {}  # name: the value last written

    @property
    def cache(self):
        return getattr(self.context, "metrics", None)

    def gauge(self, name: str, value: float, unit: str) -> None:
        if self.cache is None or self.gauges.get(name) == value:
            return
        self.gauges[name] = value
        self._add(name, value, unit, self.dimensions, MetricTypes.GAUGE)

    def count(self, name: str, label: str, value: int) -> None:
        self._add(name, value, "Count", [*self.dimensions, Dimension(COUNTERS[name], label)], MetricTypes.COUNTER)

    def observe(self, name: str, value: float, unit: str) -> None:
        self._add(name, value, unit, self.dimensions, MetricTypes.HISTOGRAM)

    def _add(self, name: str, value: float, unit: str, dimensions: list, metric_type: MetricTypes) -> None:
        if self.cache is not None:
            self.cache.add_metric(name, value, unit, dimensions=dimensions, metric_type=metric_type)

    def declare_traffic_metrics(self) -> None:
        """Put the metrics live traffic emits from the model's thread into the cache now, if the
        metrics config does not declare them: added there on first use instead, they would change
        the dict that ts/async_service.py deep-copies for every request."""
        if self.cache is None:
            return
        names = [dimension.name for dimension in self.dimensions]
        for name, unit, dimension_names, metric_type in (
            ("PaddedTokenRatio", "Ratio", names, MetricTypes.GAUGE),
            ("BucketRequests", "Count", [*names, COUNTERS["BucketRequests"]], MetricTypes.COUNTER),
            ("CacheBytes", "Bytes", names, MetricTypes.GAUGE),
            ("CachedTexts", "Count", [*names, COUNTERS["CachedTexts"]], MetricTypes.COUNTER),
        ):
            try:
                self.cache.get_metric(name, metric_type)
            except MetricsCacheKeyError:
                self.cache.add_metric_to_cache(name, unit, dimension_names, metric_type)
