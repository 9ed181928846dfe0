"""What the machine can do, and the process-wide torch settings that follow from it.

`detect()` runs once per process at handler import (it is cached, so every handler module can call
it); `configure_worker()` runs in `initialize` and shares the cores among the model's live workers;
`configure_inductor()` runs before anything compiles (a worker serving an AOT package never imports
inductor's compiler, a second of its start).
"""

import dataclasses
import functools
import logging
import os
from pathlib import Path

import torch

from handlers.worker_threads import LiveWorkers, ThreadShare

logger = logging.getLogger(__name__)

TF32_MIN_CAPABILITY = (8, 0)
CPU_MATRIX_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16")


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What was found at import, and whether TF32 was switched on."""

    device: str  # "cuda" or "cpu"
    device_name: str
    cuda_capability: tuple[int, int] | None
    tf32: bool
    cpu_flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        """True where bfloat16 matmuls run in hardware: Ampere+ tensor cores, AMX or AVX512-BF16.

        oneDNN runs bf16 matmuls natively with either CPU feature (measured here: 2.5x float32 on
        MiniLM with AVX512-BF16 alone).
        """
        if self.device == "cuda":
            return self.cuda_capability >= TF32_MIN_CAPABILITY
        return bool(self.cpu_flags & {"amx_bf16", "avx512_bf16"})

    @property
    def auto_dtype(self) -> torch.dtype:
        """The dtype `dtype: auto` picks: bf16 where native, fp16 on older CUDA, else fp32."""
        if self.native_bf16:
            return torch.bfloat16
        if self.device == "cuda":
            return torch.float16
        return torch.float32


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo"), wanted=CPU_MATRIX_FLAGS) -> frozenset[str]:
    """Which of the `wanted` CPU features this CPU has (empty where unknown)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split()) & frozenset(wanted)
    return frozenset()


@functools.cache
def detect() -> Hardware:
    """Detect the device and switch TF32 on for CUDA capability >= 8.0.

    `torch.set_float32_matmul_precision("high")` is process-wide: on a CUDA machine it also lets
    CPU float32 matmuls use a faster, lower-precision path. Cached, so it runs and logs once.
    """
    cpu_flags = read_cpu_flags()
    if not torch.cuda.is_available():
        hardware = Hardware("cpu", "cpu", None, False, cpu_flags)
        logger.info("Hardware: CPU, matrix features: %s", sorted(cpu_flags) or "none")
        return hardware
    name = torch.cuda.get_device_name()
    capability = tuple(torch.cuda.get_device_capability())
    tf32 = capability >= TF32_MIN_CAPABILITY
    if tf32:
        torch.set_float32_matmul_precision("high")
        logger.info("Hardware: %s, capability %s: TF32 matmuls enabled", name, capability)
    else:
        logger.info("Hardware: %s, capability %s: no TF32, auto dtype is float16", name, capability)
    return Hardware("cuda", name, capability, tf32, cpu_flags)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def configure_inductor() -> None:
    """Turn the inductor FX graph cache on, and make compiled kernels follow the thread count."""
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    # Inductor precompiles a C++ header (a 150 MB .gch in the temp dir) before it even looks for a
    # cached kernel, so with it a worker whose kernels all come from the cache still paid that at
    # every fresh host; without it a cold compile is no slower (README, "Cold start").
    inductor_config.cpp_cache_precompile_headers = False
    # Compiled CPU kernels read the thread count when they run instead of baking it in at compile
    # time, so a worker's share of the cores can change as workers come and go (its cost per call:
    # scripts/benchmark_threads.py, README "Tuning").
    inductor_config.cpp.dynamic_threads = True


def configure_worker(threads: int | None, min_workers: int, model_dir: Path | None) -> ThreadShare:
    """Give this worker its share of the cores.

    One thread instead of two halved MiniLM throughput for a single worker on 2 cores, so the
    default divides the cores by the live workers of the model (at least `min_workers`, which start
    together) instead of pinning everyone to one thread, and follows that count as it changes.
    """
    live = None
    if model_dir is not None and threads is None:  # a fixed `threads: N` never follows the count
        try:
            live = LiveWorkers(model_dir)
        except OSError as error:  # no writable temp dir: keep the share minWorkers gives
            logger.warning("Threads will not follow the live workers: %s", error)
    share = ThreadShare(live, usable_cores(), threads, min_workers)
    logger.info("Worker settings: %d threads, %d cores, %d workers", share.threads, share.cores, share.workers)
    return share
