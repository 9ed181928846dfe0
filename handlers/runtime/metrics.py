"""The worker's metrics, named once for every server: what they are, and the sink they go to.

A worker reports through a `MetricsSink`, which each server implements its own way (TorchServe's:
handlers/servers/torchserve/metrics_sink.py); the base class itself keeps nothing (in-process use, tests). The names
are the same on every server, so a dashboard reads them alike.
"""

GAUGES = (
    "CompileSeconds",
    "WarmupSeconds",
    "CompileCacheHit",
    "CompileFallback",
    "AotPackage",
    "RecompilesAfterReady",
    "PaddedTokenRatio",
    "CacheBytes",  # the bytes of rows the repeated-text cache holds (handler.cache_bytes)
)
# Counters, each with one dimension more than the gauges:
COUNTERS = {
    "BucketRequests": "Bucket",  # texts served per bucket ("4x32": batch x length)
    "RequestFailures": "Stage",  # requests answered 500 (preprocess, inference, postprocess or handle)
    "BatchSplits": "Cause",  # batched model calls that raised and were split, by exception type
    "EagerFallbacks": "Reason",  # workers serving eagerly though compiling was on (eager_fallback.Fallback)
    "CompileCacheErrors": "Error",  # workers serving without the host compile cache, by errno (compile_cache)
    "CachedTexts": "Outcome",  # texts answered from the repeated-text cache ("hit") or computed ("miss")
}
# Histograms of the token scheduler: per model call, its tokens (in thousands); per request, its
# wait in the queue (s). TorchServe's Prometheus histograms have the default buckets, 0.005 to 10:
# these units put them where the values fall.
HISTOGRAMS = ("CallKilotokens", "SchedulerQueueTime")


class MetricsSink:
    """Where a worker's metrics go, each call about this worker's model; this one keeps nothing."""

    def gauge(self, name: str, value: float, unit: str) -> None:
        """Set the gauge `name` (GAUGES)."""

    def count(self, name: str, label: str, value: int) -> None:
        """Add `value` to the counter `name` under its extra dimension's `label` (COUNTERS)."""

    def observe(self, name: str, value: float, unit: str) -> None:
        """One observation of the histogram `name` (HISTOGRAMS)."""
