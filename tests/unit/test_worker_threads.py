"""Live workers found through lock files, with real processes, and the thread share that follows them."""

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fakes import answered, ready_handler

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.runtime import hardware, live_workers, process_settings
from ts_compiled_handlers.runtime.live_workers import LiveWorkers
from ts_compiled_handlers.runtime.process_settings import ThreadShare

HOLDER = """
import sys, time
from ts_compiled_handlers.runtime.live_workers import LiveWorkers
entry = LiveWorkers(sys.argv[1])  # kept: its open file holds the lock
print("registered", flush=True)
time.sleep(120)
"""


def start_worker(model_dir) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(model_dir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "registered"
    return process


@pytest.mark.heavy  # starts a process
def test_workers_count_each_other_and_a_killed_one_drops_out(tmp_path):
    me = LiveWorkers(tmp_path)
    others = [start_worker(tmp_path) for _ in range(2)]
    try:
        assert me.count() == 3
        os.kill(others[0].pid, signal.SIGKILL)  # no chance to clean up: the kernel drops its lock
        others[0].wait()
        assert me.count() == 2
        assert not (me.folder / f"{others[0].pid}.worker").exists()
    finally:
        for process in others:
            process.kill()
            process.wait()
    assert me.count() == 1


@pytest.mark.heavy  # starts a process
def test_the_share_follows_the_live_workers(tmp_path, monkeypatch):
    applied = []
    monkeypatch.setattr(torch, "set_num_threads", applied.append)
    monkeypatch.setattr(process_settings, "RECOUNT_SECONDS", 0.0)
    share = ThreadShare(LiveWorkers(tmp_path), cores=4)
    assert (share.workers, share.threads) == (1, 4)
    other = start_worker(tmp_path)
    try:
        time.sleep(0.01)
        share.refresh()  # a scale-up: two workers now
        assert (share.workers, share.threads) == (2, 2)
    finally:
        other.kill()
        other.wait()
    share.refresh()  # and back down
    assert (share.workers, share.threads) == (1, 4)
    assert applied == [4, 2, 4]


def test_workers_that_start_together_share_from_the_start_and_a_fixed_count_stays(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    assert ThreadShare(LiveWorkers(tmp_path), cores=4, starting=2).threads == 2
    fixed = ThreadShare(LiveWorkers(tmp_path / "other"), cores=4, fixed=3, starting=2)
    assert fixed.threads == 3


def test_handlers_built_twice_in_one_process_are_one_worker(tmp_path):
    first, second = LiveWorkers(tmp_path), LiveWorkers(tmp_path)
    assert first.count() == second.count() == 1


def test_a_read_only_model_folder_gets_nothing_written_into_it(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    model_dir.chmod(0o555)
    try:
        assert LiveWorkers(model_dir).count() == 1
        assert list(model_dir.iterdir()) == []
    finally:
        model_dir.chmod(0o755)


def test_without_a_writable_temp_dir_the_worker_keeps_the_starting_share(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(live_workers, "ROOT", Path("/proc/no-such-place"))
    share = process_settings.share_cores(None, min_workers=2, model_dir=tmp_path)
    assert share.live is None and share.workers == 2 and share.threads == max(1, hardware.usable_cores() // 2)
    assert "Threads will not follow the live workers" in caplog.text


@pytest.mark.heavy  # starts a process
def test_a_new_thread_share_is_traced_once_and_never_answered_eagerly(tiny_bert, monkeypatch, caplog):
    handler = ready_handler("embedding", tiny_bert, buckets={"seq_lens": [8, 16], "batch_sizes": [1, 2]})
    before, graphs = handler.threads.threads, compiled_graph_count()
    monkeypatch.setattr(process_settings, "RECOUNT_SECONDS", 0.0)
    handler.threads.cores = 2 * before + 2  # so that a second worker changes this one's share

    def embed() -> None:
        answers = answered(handler, [{"inputs": "a few words"}, {"inputs": "b"}])
        assert all(len(answer["embedding"]) == 32 for answer in answers)

    other = start_worker(tiny_bert)
    try:
        with caplog.at_level(logging.INFO):
            embed()
    finally:
        other.kill()
        other.wait()
    assert handler.threads.threads == torch.get_num_threads() == before + 1
    assert f"Grid traced again at {before + 1} threads" in caplog.text
    assert compiled_graph_count() == 2 * graphs and handler.engine.model.recompiles_after_ready == 0
    handler.threads.cores = before  # alone again, at the first count: its graphs are still there
    embed()
    assert handler.threads.threads == before and compiled_graph_count() == 2 * graphs
    assert handler.engine.model.recompiles_after_ready == 0
