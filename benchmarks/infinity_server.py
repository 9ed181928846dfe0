"""Infinity (michaelfeil/infinity, `infinity_emb`) as a load-test contender, in a venv of its own.

Infinity pins its own dependencies (sentence-transformers < 4, numpy < 2), which cannot share our
venv, so `ensure_venv` makes one under runs/ the first time a contender asks for it: the same CPU
torch first (an open range would fetch a multi-GB CUDA build), then `infinity-emb[server,torch]`
at the version measured. A contender is one configuration of its torch engine, `infinity-DTYPE`
or `infinity-DTYPE-compile` (its `--compile`: torch.compile of the model); the load test starts it
on a free loopback port, drives it with the same texts as ours (OpenAI's `/embeddings` body, one
text a request) and stops it (benchmarks/peer_server.py).
"""

import subprocess
import sys
from pathlib import Path

from ts_compiled_handlers.benchmarks.peer_server import PeerServer

VERSION = "0.0.78"
DEFAULT_VENV = Path("runs") / "infinity-venv"
CONTENDERS = ("infinity-float32", "infinity-float32-compile", "infinity-bfloat16", "infinity-bfloat16-compile")


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


class InfinityServer(PeerServer):
    """One Infinity server of `contender`'s configuration over `model_dir`, on `port`."""

    def __init__(self, contender: str, model_dir: Path, port: int, workdir: Path, venv: Path = DEFAULT_VENV):
        super().__init__(model_dir, port, workdir)
        parts = contender.split("-")  # infinity-DTYPE[-compile]
        self.dtype, self.compiled, self.venv = parts[1], parts[-1] == "compile", venv
        self.label = f"infinity-{self.dtype}{'-compile' if self.compiled else ''}"

    def command(self) -> list[str]:
        command = [str(ensure_venv(self.venv)), "v2", "--model-id", str(self.model_dir), "--port", str(self.port)]
        command += ["--host", "127.0.0.1", "--engine", "torch", "--dtype", self.dtype, "--device", "cpu"]
        command += ["--batch-size", "8", "--no-bettertransformer"]
        return command + (["--compile"] if self.compiled else ["--no-compile"])

    def environment(self) -> dict[str, str]:
        return {**super().environment(), "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
