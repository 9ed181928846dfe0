"""CPU time each process of a served run spent, read from /proc (Linux): where a request's CPU went.

On one small machine the clients, TorchServe's frontend and the worker share the cores, so what the
first two take bounds what any worker could serve there: `ceiling_per_second` is that bound for a
worker that costs nothing beyond its model's in-process CPU.
"""

import os
import resource
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid`, all its threads (utime and stime, proc(5))."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15, counted from the state (3)


def own_seconds() -> float:
    """User and system CPU seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cores() -> int:
    """The cores this process may run on (a container or taskset may allow fewer than the machine has)."""
    return len(os.sched_getaffinity(0))


class CpuMeter:
    """CPU seconds of the named processes, and of this one as `clients`, since the meter was made."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.started = self.read()

    def read(self) -> dict[str, float]:
        return {**{name: process_seconds(pid) for name, pid in self.pids.items()}, "clients": own_seconds()}

    def spent(self) -> dict[str, float]:
        now = self.read()
        return {name: now[name] - self.started[name] for name in now}


def ceiling_per_second(cores: int, model_seconds_each: float, other_seconds_each: float) -> float:
    """The most items per second `cores` serve when each costs the model's CPU plus the others' CPU."""
    return cores / (model_seconds_each + other_seconds_each)
