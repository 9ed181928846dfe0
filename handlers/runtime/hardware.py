"""What the machine can do: device, CPU matrix features, usable cores, and TF32 where it pays.

`detect()` runs once per process: at the import of TorchServe's handler module
(handlers/servers/torchserve/handler.py), elsewhere when the first worker reads its archive (it is
cached). TF32 is the one process-wide setting made here; every other one is in
handlers/runtime/process_settings.py.
"""

import dataclasses
import functools
import logging
import math
import os
from pathlib import Path
from typing import Callable

import torch

logger = logging.getLogger(__name__)

TF32_MIN_CAPABILITY = (8, 0)
# A configured dtype name (handlers/configuration/config.py DTYPE_NAMES, less `auto`) -> its torch dtype.
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


def serving_dtype(configured: str, refuses: Callable[[torch.dtype], bool]) -> torch.dtype:
    """The one dtype policy, for a compiled start and an AOT package's alike: a configured dtype as
    it is; `auto`, the hardware's pick (`auto_dtype`), or float32 where `refuses(pick)` says the
    pick drifts from float32 on this model (the start's check, or the one the package's build made)."""
    if configured != "auto":
        return DTYPES[configured]
    picked = detect().auto_dtype
    return torch.float32 if picked != torch.float32 and refuses(picked) else picked


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo"), wanted=CPU_MATRIX_FLAGS) -> frozenset[str]:
    """Which of the `wanted` CPU features this CPU has (None: all of them; empty where unknown)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            found = frozenset(line.split(":", 1)[1].split())
            return found if wanted is None else found & frozenset(wanted)
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


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cores(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """Cores this process may use: its CPU affinity, cut to its container's CPU quota (rounded down,
    at least 1). In a pod limited to 2 CPUs on a 64-core node the affinity is 64, the quota 2."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota(cgroup_root, proc_cgroup)
    return cores if quota is None else max(1, min(cores, math.floor(quota)))


def cores_described(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> str:
    """`usable_cores` and where it comes from, for the ready line."""
    quota = cpu_quota(cgroup_root, proc_cgroup)
    cores = usable_cores(cgroup_root, proc_cgroup)
    return f"{cores} cores" + ("" if quota is None else f" (container CPU quota {quota:g})")


def cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota in cores of this process's cgroup and its ancestors (the smallest), from cgroup
    v2's `cpu.max` or v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`; None where there is none."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    quotas = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2's unified hierarchy: "0::/path"
            quotas += [_v2_quota(folder) for folder in _folders(cgroup_root, path)]
        elif "cpu" in controllers.split(","):  # v1: "N:cpu,cpuacct:/path"
            mount = cgroup_root / controllers
            mount = mount if mount.is_dir() else cgroup_root / "cpu"
            quotas += [_v1_quota(folder) for folder in _folders(mount, path)]
    found = [quota for quota in quotas if quota is not None]
    return min(found) if found else None


def _folders(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and its ancestors' under `mount`; the mount itself where the path is not
    there (a container's own cgroup namespace shows its cgroup at the root)."""
    parts = [part for part in path.strip("/").split("/") if part]
    folders = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [folder for folder in folders if folder.is_dir()] or [mount]


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period
