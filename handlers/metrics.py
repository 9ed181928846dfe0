"""Custom TorchServe metrics of this package, as model-level gauges.

They reach the metrics API only because `handlers/metrics.yaml` (the file `metrics_config` in
config.properties points to) declares them with the same names and dimensions.
"""

from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes

NAMES = ("CompileSeconds", "WarmupSeconds", "CompileCacheHit", "RecompilesAfterReady", "PaddedTokenRatio")


def emit(context, name: str, value: float, unit: str) -> None:
    """Set the gauge `name` for this model; a context without metrics (unit tests) is skipped."""
    metrics = getattr(context, "metrics", None)
    if metrics is None:
        return
    dimensions = [Dimension("ModelName", context.model_name), Dimension("Level", "Model")]
    metrics.add_metric(name, value, unit, dimensions=dimensions, metric_type=MetricTypes.GAUGE)
