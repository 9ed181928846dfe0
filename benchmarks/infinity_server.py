"""Infinity (michaelfeil/infinity, `infinity_emb`) as a load-test contender, in a venv of its own.

Infinity pins its own dependencies (sentence-transformers < 4, numpy < 2), which cannot share our
venv, so `ensure_venv` makes one under runs/ the first time a contender asks for it: the same CPU
torch first (an open range would fetch a multi-GB CUDA build), then `infinity-emb[server,torch]`
at the version measured. A contender is one configuration of its torch engine, `infinity-DTYPE`
or `infinity-DTYPE-compile` (its `--compile`: torch.compile of the model); the load test starts it
on a free loopback port, drives it with the same texts as ours (OpenAI's `/embeddings` body, one
text a request) and stops it, with the allocator the TorchServe contenders get (handlers/runtime/allocator.py:
tcmalloc where installed), so the servers are compared, not their allocators.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from ts_compiled_handlers.runtime import allocator

VERSION = "0.0.78"
DEFAULT_VENV = Path("runs") / "infinity-venv"
CONTENDERS = ("infinity-float32", "infinity-float32-compile", "infinity-bfloat16", "infinity-bfloat16-compile")
STARTUP_SECONDS = 600


def ensure_venv(venv: Path = DEFAULT_VENV) -> Path:
    """The venv's `infinity_emb` executable, installed there first if missing."""
    executable = venv / "bin" / "infinity_emb"
    if executable.is_file():
        return executable
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    import torch

    subprocess.run([*pip, f"torch=={torch.__version__.split('+')[0]}"], check=True)  # our CPU build, first
    subprocess.run([*pip, f"infinity-emb[server,torch]=={VERSION}"], check=True)
    return executable


class InfinityServer:
    """One Infinity server of `contender`'s configuration over `model_dir`, on `port`."""

    def __init__(self, contender: str, model_dir: Path, port: int, workdir: Path, venv: Path = DEFAULT_VENV):
        parts = contender.split("-")  # infinity-DTYPE[-compile]
        self.dtype, self.compiled = parts[1], parts[-1] == "compile"
        self.model_dir, self.port, self.workdir, self.venv = Path(model_dir), port, Path(workdir), venv
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        command = [str(ensure_venv(self.venv)), "v2", "--model-id", str(self.model_dir), "--port", str(self.port)]
        command += ["--host", "127.0.0.1", "--engine", "torch", "--dtype", self.dtype, "--device", "cpu"]
        command += ["--batch-size", "8", "--no-bettertransformer"]
        return command + (["--compile"] if self.compiled else ["--no-compile"])

    def start(self) -> None:
        """Start it and wait until it answers an embedding (its own warm-up included)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / f"infinity-{self.dtype}{'-compile' if self.compiled else ''}.log").open("ab")
        environment = {**os.environ, "INFINITY_ANONYMOUS_USAGE_STATS": "0", "HF_HUB_OFFLINE": "1"}
        environment.update(allocator.preload(environment))
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=environment)
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Infinity exited with {self.process.returncode}; see {log.name}")
            try:
                if self.embed(["hello"]).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"Infinity did not answer within {STARTUP_SECONDS} s; see {log.name}")

    def body(self, texts: list[str]) -> bytes:
        return json.dumps({"model": str(self.model_dir), "input": texts}).encode()

    def embed(self, texts: list[str]) -> requests.Response:
        headers = {"Content-Type": "application/json"}
        return requests.post(f"{self.url}/embeddings", data=self.body(texts), headers=headers, timeout=300)

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
