"""Timing and summary statistics shared by the benchmarks.

A run's spread is part of its result: the coefficient of variation (std / mean) is reported and a
run over `NOISY_CV` is flagged, so a table never passes off a noisy number as a clean one.
"""

import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

NOISY_CV = 0.05
# The gate's tolerance the benchmarks serve `quantize: int8-all` at: MiniLM reads 0.988 there, below the
# default floor (0.99), and its speed is still worth measuring beside `int8`.
INT8_ALL_TOLERANCE = 0.05


def percentile(samples: list[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least `fraction` of them at or below."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def summarize(samples: list[float]) -> dict:
    """median, mean, std, p50/p90/p99, cv and the noisy flag of some measurements."""
    mean = statistics.fmean(samples)
    std = statistics.pstdev(samples)
    cv = std / mean if mean else 0.0
    return {
        "count": len(samples),
        "median": statistics.median(samples),
        "mean": mean,
        "std": std,
        "p50": percentile(samples, 0.50),
        "p90": percentile(samples, 0.90),
        "p99": percentile(samples, 0.99),
        "cv": cv,
        "noisy": cv > NOISY_CV,
    }


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so the clock reads what the device did, not what was queued."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(call: Callable[[], object], warmup: int, iterations: int, device: torch.device) -> list[float]:
    """Seconds per call of `call`, after `warmup` untimed calls."""
    for _ in range(warmup):
        call()
    synchronize(device)
    samples = []
    for _ in range(iterations):
        began = time.perf_counter()
        call()
        synchronize(device)
        samples.append(time.perf_counter() - began)
    return samples


def time_interleaved(
    calls: dict[str, Callable[[], object]], warmup: int, iterations: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per call of each contender, timed in turns so that drift of the machine hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        time_calls(call, warmup, 0, device)
    for _ in range(iterations):
        for name, call in calls.items():
            samples[name] += time_calls(call, 0, 1, device)
    return samples


def time_buckets(handler, contenders: Callable[[list[list[int]]], dict], warmup: int, iterations: int):
    """(batch, seq_len, token ids, timings per contender) for every bucket of the handler's grid:
    `contenders(ids)` names the calls, timed in turns (`time_interleaved`) and summarized."""
    plan, filler = handler.engine.plan, handler.serving.probes.filler
    for batch, seq_len in [(b, s) for s in plan.seq_lens for b in plan.batch_sizes]:
        ids = filler(seq_len, batch)
        samples = time_interleaved(contenders(ids), warmup, iterations, handler.engine.device)
        yield batch, seq_len, ids, {name: summarize(values) for name, values in samples.items()}


def matmul_flops_per_second(dtype: torch.dtype, device: torch.device, size: int = 2048, iterations: int = 20) -> float:
    """The machine's practical ceiling: FLOP/s of the fastest of some large square matmuls in `dtype`.

    The fastest, not the median: a ceiling is what the machine can do, and a noisy neighbour only
    ever slows a call down.
    """
    left = torch.randn(size, size, device=device).to(dtype)
    right = torch.randn(size, size, device=device).to(dtype)
    samples = time_calls(lambda: torch.mm(left, right), 2, iterations, device)
    return 2 * size**3 / min(samples)


def machine_summary() -> str:
    """torch, the device (GPU name or CPU model), the CPU's matrix features, cores and threads."""
    from ts_compiled_handlers.runtime.hardware import detect

    hardware = detect()
    device = hardware.device_name
    if hardware.device == "cpu":
        cpuinfo = Path("/proc/cpuinfo")
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        device = models[0] if models else platform.processor() or "cpu"
    flags = ", ".join(sorted(hardware.cpu_flags)) or "no AMX/AVX512-BF16"
    cores = len(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    return f"torch {torch.__version__}, {device} ({platform.machine()}, {flags}), {cores} cores, {threads} threads"
