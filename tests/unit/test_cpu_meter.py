"""The CPU accounting of benchmarks/benchmark_scheduler.py: /proc's counters, the meter, the
ceiling's arithmetic, and the cutting of the texts into the in-process calls."""

import os
import subprocess
import sys
import time

import pytest

from ts_compiled_handlers.benchmarks import cpu
from ts_compiled_handlers.benchmarks.benchmark_scheduler import calls_of


def burn(seconds: float) -> None:
    """Keep one core busy for `seconds` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.heavy  # starts a process
def test_the_meter_counts_this_process_as_the_clients_and_another_by_its_pid():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        meter = cpu.CpuMeter({"sleeper": sleeper.pid, "self": os.getpid()})
        burn(0.3)
        spent = meter.spent()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert set(spent) == {"sleeper", "self", "clients"}
    assert spent["clients"] >= 0.3
    assert spent["self"] >= 0.2  # /proc counts in clock ticks (1/100 s here): the same work, coarser
    assert spent["sleeper"] < 0.1


@pytest.mark.heavy  # starts a process
def test_process_seconds_reads_a_name_with_spaces_and_parentheses(tmp_path):
    """proc(5)'s second field is the command name in parentheses, and it may hold both."""
    odd = tmp_path / "a (b) c"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        assert 0 <= cpu.process_seconds(child.pid) < 5
    finally:
        child.kill()
        child.wait()


def test_the_ceiling_shares_the_cores_between_the_model_and_the_rest():
    assert cpu.ceiling_per_second(2, 0.008, 0.002) == pytest.approx(200)
    assert cpu.ceiling_per_second(2, 0.010, 0.0) == pytest.approx(200)
    assert cpu.cores() >= 1


def test_in_process_calls_keep_the_order_and_both_bounds():
    token_ids = [[1] * n for n in (30, 50, 10, 10, 10, 90, 5)]
    calls = calls_of(token_ids, budget=100)
    assert [[len(ids) for ids in call] for call in calls] == [[30, 50, 10, 10], [10, 90], [5]]
    capped = calls_of(token_ids, budget=100, most_requests=2)
    assert [[len(ids) for ids in call] for call in capped] == [[30, 50], [10, 10], [10, 90], [5]]
    assert [ids for call in capped for ids in call] == token_ids
