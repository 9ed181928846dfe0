"""`hfserve serve MODEL` from an empty folder, as a user coming from TEI or vLLM runs it: one
command, no --task, the real MiniLM, answers as sentence-transformers gives them, a clean stop on
SIGINT and SIGTERM, and a second run that reuses the first's archive and compile cache."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
import torch
from server_logs import logged_lines

pytestmark = pytest.mark.integration

HFSERVE = Path(sys.executable).parent / "hfserve"
TEXTS = ["hello world", "The cat sat on the mat.", "Serving compiled transformers from one command."]


def three_free_ports() -> int:
    """A port P with P, P+1 and P+2 free (inference, management, metrics)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port < 65000 and not any(listening(port + i) for i in range(3)):
            return port
    raise RuntimeError("no three free ports in a row")


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Served:
    def __init__(self, folder: Path, model: Path, port: int, *flags: str):
        env = {**os.environ, "HFSERVE_CACHE_DIR": str(folder / "compile-cache")}
        command = [str(HFSERVE), "serve", str(model), "--name", "minilm", "--port", str(port), *flags]
        self.process = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, text=True)
        self.lines = []
        deadline = time.monotonic() + 600
        while not self.lines or not self.lines[-1].startswith("ready: "):
            line = self.process.stdout.readline()
            assert line, f"hfserve serve ended before it was ready:\n{''.join(self.lines)}"
            assert time.monotonic() < deadline
            self.lines.append(line)
        self.workdir = folder / "runs" / "serve-minilm"
        frontend = int((self.workdir / "tmp" / ".model_server.pid").read_text().split()[0])
        self.torchserve = [psutil.Process(frontend), *psutil.Process(frontend).children(recursive=True)]

    def stop(self, signum: int) -> str:
        self.process.send_signal(signum)
        rest, _ = self.process.communicate(timeout=120)
        return rest

    def left_running(self) -> list[int]:
        """TorchServe's processes (the frontend and its workers) still running a moment after the stop."""
        _, alive = psutil.wait_procs(self.torchserve, timeout=10)
        return [process.pid for process in alive]


def test_one_command_serves_minilm_as_sentence_transformers_and_stops_cleanly_then_reuses_its_archive(
    tmp_path, minilm_dir
):
    from sentence_transformers import SentenceTransformer

    port = three_free_ports()
    first = Served(tmp_path, minilm_dir, port)
    output = "".join(first.lines)
    assert "task: embedding, read from the model's files" in output  # no --task given
    url = f"http://127.0.0.1:{port}/predictions/minilm"
    key_file = first.workdir / "key_file.json"
    assert first.lines[-1].strip() == (
        f"ready: {url} (OpenAI base URL {url}/1.0/v1, TEI base URL {url}/1.0); the key: inference in {key_file}"
    )
    key = json.loads(key_file.read_text())["inference"]["key"]
    answer = requests.post(f"{url}/1.0/embed", json={"inputs": TEXTS}, headers={"Authorization": f"Bearer {key}"})
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, convert_to_tensor=True)
    got = torch.tensor(answer.json())
    assert torch.nn.functional.cosine_similarity(got, expected).min() >= 0.99

    assert first.stop(signal.SIGINT).strip().endswith("stopped") and first.process.returncode == 0
    assert not psutil.pid_exists(first.torchserve[0].pid)  # the frontend ended before `serve` did
    assert not listening(port) and first.left_running() == []
    archive = tmp_path / "model_store" / "minilm.mar"
    built_at = archive.stat().st_mtime_ns

    second = Served(tmp_path, minilm_dir, port)
    assert f"reusing {Path('model_store') / 'minilm.mar'}" in "".join(second.lines)
    assert archive.stat().st_mtime_ns == built_at
    ready = logged_lines(second.workdir, "MODEL_LOG - Ready in", at_least=2)
    assert len(ready) == 2 and "compile cache: hit" in ready[-1]  # this run's worker: the first's kernels
    assert second.stop(signal.SIGTERM).strip().endswith("stopped") and second.process.returncode == 0
    assert not psutil.pid_exists(second.torchserve[0].pid) and second.left_running() == []


def test_bad_input_is_one_line_before_anything_starts(tmp_path):
    missing = subprocess.run(
        [str(HFSERVE), "serve", str(tmp_path / "nothing")], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert not (tmp_path / "runs").exists()


def test_a_signal_before_ready_stops_torchserve_at_once(tmp_path, minilm_dir):
    port = three_free_ports()
    command = [str(HFSERVE), "serve", str(minilm_dir), "--name", "minilm", "--port", str(port)]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "runs" / "serve-minilm" / "tmp" / ".model_server.pid"
    deadline = time.monotonic() + 300
    while not pid_file.is_file():  # TorchServe started; MiniLM's worker compiles for 20 s or more
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    time.sleep(1)  # the pid written in full
    frontend = psutil.Process(int(pid_file.read_text().split()[0]))
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0 and out.strip().endswith("stopped") and "ready:" not in out, err
    assert not frontend.is_running() or frontend.status() == psutil.STATUS_ZOMBIE
