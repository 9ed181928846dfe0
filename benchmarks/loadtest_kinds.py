"""The load test's contenders that answer other outputs than the dense vector, on the same encoder
(issue 58): each one's model folder (the encoder itself, or made from it as benchmark_sparse makes
its twins), its task, and what each request asks for beside its text (a JSON body).

- `ours-binary`: `ours-auto`'s archive, each answer a packed binary vector (`precision: binary`);
- `ours-multi-vector`: MiniLM's encoder as a ColBERT model (scripts/make_tiny_models.py's `colbert`:
  a seeded projection to 32 values, documents up to 256 tokens), each text a document;
- `ours-m3`: the encoder as a bge-m3 model (seeded heads in FlagEmbedding's files), each request
  asking for all three outputs.

Their answers are not dense vectors, so the run compares none of them with ours-float32's.
"""

import json
from pathlib import Path

KINDS = {  # name: (task, the body's fields beside "inputs")
    "ours-binary": ("embedding", {"precision": "binary"}),
    "ours-multi-vector": ("multi-vector", {"input_type": "document"}),
    "ours-m3": ("m3-embedding", {"return_sparse": True, "return_colbert_vecs": True}),
}


def model_folder(name: str, encoder_dir: Path, scratch: Path) -> Path:
    """The folder `name`'s archive is built from: the encoder's, or its twin made under `scratch`."""
    from ts_compiled_handlers.benchmarks.benchmark_sparse import colbert_twin, m3_twin

    if name == "ours-multi-vector":
        return colbert_twin(scratch)
    if name == "ours-m3":
        (scratch / "m3").mkdir(parents=True, exist_ok=True)
        return m3_twin(encoder_dir, scratch / "m3")
    return encoder_dir


def body(name: str, text: str) -> bytes:
    """The JSON body that sends `text` to contender `name`."""
    return json.dumps({"inputs": text, **KINDS[name][1]}).encode()
