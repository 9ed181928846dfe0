"""Custom TorchServe metrics of this package, as model-level gauges.

They reach the metrics API only because `handlers/metrics.yaml` (the file `metrics_config` in
config.properties points to) declares them with the same names and dimensions.
"""

from ts.metrics.dimension import Dimension
from ts.metrics.metric_cache_errors import MetricsCacheKeyError
from ts.metrics.metric_type_enum import MetricTypes

GAUGES = (
    "CompileSeconds",
    "WarmupSeconds",
    "CompileCacheHit",
    "CompileFallback",
    "RecompilesAfterReady",
    "PaddedTokenRatio",
)
# Counters, each with one dimension more than the gauges:
COUNTERS = {
    "BucketRequests": "Bucket",  # texts served per bucket ("4x32": batch x length)
    "RequestFailures": "Stage",  # requests answered 500 (preprocess, inference, postprocess or handle)
    "BatchSplits": "Cause",  # batched model calls that raised and were split, by exception type
}


# Histograms under asyncCommunication: per model call, its tokens (in thousands); per request, its
# wait in the token scheduler (s). TorchServe's Prometheus histograms have the default buckets,
# 0.005 to 10: these units put them where the values fall.
HISTOGRAMS = ("CallKilotokens", "SchedulerQueueTime")


def _dimensions(context) -> list[Dimension]:
    return [Dimension("ModelName", context.model_name), Dimension("Level", "Model")]


def emit(context, name: str, value: float, unit: str) -> None:
    """Set the gauge `name` for this model; a context without metrics (unit tests) is skipped."""
    metrics = getattr(context, "metrics", None)
    if metrics is None:
        return
    metrics.add_metric(name, value, unit, dimensions=_dimensions(context), metric_type=MetricTypes.GAUGE)


def count(context, name: str, label: str, value: int) -> None:
    """Add `value` to the counter `name` of this model under its extra dimension's `label`."""
    metrics = getattr(context, "metrics", None)
    if metrics is None:
        return
    dimensions = [*_dimensions(context), Dimension(COUNTERS[name], label)]
    metrics.add_metric(name, value, "Count", dimensions=dimensions, metric_type=MetricTypes.COUNTER)


def observe(context, name: str, value: float, unit: str) -> None:
    """One observation of the histogram `name` for this model."""
    metrics = getattr(context, "metrics", None)
    if metrics is None:
        return
    metrics.add_metric(name, value, unit, dimensions=_dimensions(context), metric_type=MetricTypes.HISTOGRAM)


def cache_traffic_metrics(context) -> None:
    """Put the metrics live traffic emits from the model's thread (handlers/model_thread.py) into the
    worker's metrics cache now, if its metrics config does not declare them: added there on first
    use instead, they would change the dict that ts/async_service.py deep-copies for every request."""
    metrics = getattr(context, "metrics", None)
    if metrics is None:
        return
    names = [dimension.name for dimension in _dimensions(context)]
    for name, unit, dimension_names, metric_type in (
        ("PaddedTokenRatio", "Ratio", names, MetricTypes.GAUGE),
        ("BucketRequests", "Count", [*names, COUNTERS["BucketRequests"]], MetricTypes.COUNTER),
    ):
        try:
            metrics.get_metric(name, metric_type)
        except MetricsCacheKeyError:
            metrics.add_metric_to_cache(name, unit, dimension_names, metric_type)
