"""What the machine can do: device, CPU matrix features, usable cores, and TF32 where it pays.

`detect()` runs once per process at handler import (it is cached, so every handler module can call
it). TF32 is the one process-wide setting made here, at import; every other one is in
handlers/process_settings.py.
"""

import dataclasses
import functools
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

TF32_MIN_CAPABILITY = (8, 0)
# A configured dtype name (handlers/config.py DTYPE_NAMES, less `auto`) -> its torch dtype.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
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

        oneDNN runs bf16 matmuls natively with either CPU feature, AVX512-BF16 alone included
        (docs/performance.md, "Per bucket").
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
