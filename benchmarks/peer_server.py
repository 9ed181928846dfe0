"""Another engine's embedding server as a load-test contender (Infinity, vLLM): started on a free
loopback port from a venv of its own, waited for until it answers an embedding, sent the same
texts as ours in OpenAI's `embeddings` body, and stopped. Each engine's module says how it is
installed and started (`command`, `environment`); this one starts, waits and stops any of them.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import requests

from ts_compiled_handlers.runtime import allocator

STARTUP_SECONDS = 600


class PeerServer:
    """One peer server over `model_dir` on `port`; subclasses give `command()`, `path`, `label`."""

    path = "/embeddings"  # OpenAI's embeddings route on the server
    label = "peer"  # the log's name

    def __init__(self, model_dir: Path, port: int, workdir: Path):
        self.model_dir, self.port, self.workdir = Path(model_dir), port, Path(workdir)
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """What the peer runs with: offline, and the allocator the TorchServe contenders get
        (handlers/runtime/allocator.py: tcmalloc where installed), so servers are compared, not allocators."""
        environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
        environment.update(allocator.preload(environment))
        return environment

    @property
    def served_name(self) -> str:
        return str(self.model_dir)

    def start(self) -> None:
        """Start it and wait until it answers an embedding (its own warm-up included)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / f"{self.label}.log").open("ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment())
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.process.returncode}; see {log.name}")
            try:
                if self.embed(["hello"]).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"{self.label} did not answer within {STARTUP_SECONDS} s; see {log.name}")

    def body(self, texts: list[str]) -> bytes:
        return json.dumps({"model": self.served_name, "input": texts}).encode()

    def embed(self, texts: list[str]) -> requests.Response:
        headers = {"Content-Type": "application/json"}
        return requests.post(f"{self.url}{self.path}", data=self.body(texts), headers=headers, timeout=300)

    def embedding(self, text: str) -> list[float]:
        return self.embed([text]).json()["data"][0]["embedding"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
