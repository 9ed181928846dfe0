"""What a worker says when it is ready: one log line with everything about its start, and the start gauges."""

import logging

from ts_compiled_handlers.engine.engine import Engine
from ts_compiled_handlers.runtime import hardware
from ts_compiled_handlers.runtime.metrics import MetricsSink
from ts_compiled_handlers.runtime.process_settings import ThreadShare
from ts_compiled_handlers.startup.build_steps import CACHE_SOURCES
from ts_compiled_handlers.startup.serving import Serving, Started

logger = logging.getLogger(__name__)


def model_source(engine: Engine, started: Started) -> str:
    """What the worker serves from: `aot package`, `archive cache`, `host cache`, `compiled` or
    `eager`, with why where compiling was meant and failed."""
    if not engine.model.is_compiled:
        fallback = engine.model.fallback
        return f"eager ({fallback})" if fallback else "eager"
    sources = {"aot": "aot package", "archive": "archive cache", "host": "host cache"}
    return sources.get(started.cache_source, "compiled")


def announce(
    metrics: MetricsSink, engine: Engine, started: Started, serving: Serving, threads: ThreadShare, seconds: float
) -> None:
    """The start gauges, then the ready line."""
    report, options = started.report, serving.config.compile
    source = model_source(engine, started)
    metrics.gauge("CompileSeconds", round(report.compile_seconds, 3), "Seconds")
    metrics.gauge("WarmupSeconds", round(report.warmup_seconds, 3), "Seconds")
    metrics.gauge("RecompilesAfterReady", 0, "Count")
    metrics.gauge("CompileCacheHit", int(started.cache_source in ("archive", "host")), "Count")
    metrics.gauge("CompileFallback", int(options.enable and not engine.model.is_compiled), "Count")
    metrics.gauge("AotPackage", int(source == "aot package"), "Count")
    if engine.model.fallback is not None:
        metrics.count("EagerFallbacks", engine.model.fallback.reason, 1)
    if started.host_cache is not None and started.host_cache.failure is not None:
        metrics.count("CompileCacheErrors", started.host_cache.failure, 1)
    logger.info(
        "Ready in %.1fs from %s: %s, %s, dtype %s, compiled=%s mode=%s dynamic=%s regional=%s, "
        "lengths %s x batches %s, %d graphs, model load %.1fs, first pass over the grid %.1fs, warm-up %.1fs, "
        "%d threads (live workers: %d, %s), compile cache: %s",
        seconds,
        source,
        hardware.detect().device_name,
        sorted(hardware.detect().cpu_flags),
        dtype_described(engine),
        engine.model.is_compiled,
        options.mode,
        engine.plan.dynamic,
        options.regional,
        list(engine.plan.seq_lens),
        list(engine.plan.batch_sizes),
        report.graphs,
        started.load_seconds,
        report.compile_seconds,
        report.warmup_seconds,
        threads.threads,
        threads.workers,
        hardware.cores_described(),
        CACHE_SOURCES[started.cache_source],
    )


def dtype_described(engine: Engine) -> str:
    """The engine's dtype, and where its linears are int8, what their gate measured."""
    dtype = str(engine.dtype).removeprefix("torch.")
    gate = engine.model.int8_gate
    return f"{dtype} with int8 linears ({gate.last})" if gate is not None and gate.last is not None else dtype
