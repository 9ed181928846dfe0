"""FlagEmbedding's answers for the test bge-m3 model, kept as the tests' reference (tests/data/flag_m3.json).

FlagEmbedding 1.4 imports names transformers 5 removed, so it runs in a venv of its own (transformers
4.57); scripts/references/make.sh makes that venv and runs this with it:

    python scripts/references/flag_m3.py MODEL_DIR OUT_JSON

MODEL_DIR is `scripts/make_tiny_models.py`'s `m3` model (weights from a fixed seed; the JSON keeps
their digest, and the tests check it before they compare). Vectors are kept as base64 of
little-endian float32. Each (query, document) pair is scored in a call of its own, as a rerank
call scores it: in a batch, FlagEmbedding's padded documents' zero vectors take part in MaxSim.
"""

import base64
import hashlib
import json
import sys
from pathlib import Path

TEXTS = [
    "the cat sat on the mat",
    "alice walks to paris and bob runs to london with carol",
    "hello world, the fast model serves every token " * 3,
    "x",
]
QUERY = "the cat walks to paris with alice"
WEIGHTS = [0.4, 0.2, 0.4]  # dense, sparse, colbert: the weights bge-m3's model card uses


def weights_digest(model_dir: Path) -> str:
    """The encoder's safetensors bytes and the heads' tensors (a pickle's bytes may vary)."""
    import torch

    digest = hashlib.sha256((model_dir / "model.safetensors").read_bytes())
    for name in ("colbert_linear.pt", "sparse_linear.pt"):
        state = torch.load(model_dir / name, map_location="cpu", weights_only=True)
        for key in sorted(state):
            digest.update(key.encode() + state[key].float().numpy().astype("<f4").tobytes())
    return digest.hexdigest()


def packed(array) -> dict:
    array = array.astype("<f4")
    return {"shape": list(array.shape), "base64": base64.b64encode(array.tobytes()).decode()}


def main(model_dir: str, out: str) -> None:
    import FlagEmbedding
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(model_dir, use_fp16=False, devices="cpu")
    encoded = model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    scores = [model.compute_score([QUERY, text], weights_for_different_modes=WEIGHTS, batch_size=1) for text in TEXTS]
    reference = {
        "flag_embedding": getattr(FlagEmbedding, "__version__", "1.4.2"),
        "weights_sha256": weights_digest(Path(model_dir)),
        "texts": TEXTS,
        "dense_vecs": packed(encoded["dense_vecs"]),
        "lexical_weights": [{key: float(value) for key, value in one.items()} for one in encoded["lexical_weights"]],
        "colbert_vecs": [packed(vectors) for vectors in encoded["colbert_vecs"]],
        "query": QUERY,
        "weights": WEIGHTS,
        "scores": [{mode: float(value) for mode, value in score.items()} for score in scores],
    }
    Path(out).write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
