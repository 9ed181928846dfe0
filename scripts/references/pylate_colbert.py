"""PyLate's answers for the test ColBERT model, kept as the tests' reference (tests/data/pylate_colbert.json).

PyLate 1.6 pins sentence-transformers 5.3 and transformers <= 5.3, older than the package's, so it
runs in a venv of its own; scripts/references/make.sh makes that venv and runs this with it:

    python scripts/references/pylate_colbert.py MODEL_DIR OUT_JSON

MODEL_DIR is `scripts/make_tiny_models.py`'s `colbert` model: MiniLM's weights and a projection
from a fixed seed, the same on every machine (the JSON keeps the weights' digest, and the tests
check it before they compare). Vectors are kept as base64 of little-endian float32.
"""

import base64
import hashlib
import json
import sys
from pathlib import Path

QUERIES = [
    "hello world",
    "what is the capital of France?",
    "a query much longer than the model's query length, so that PyLate cuts it before expanding it",
]
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "Hello, world! (A greeting: used in every first program.)",
    "Berlin is the capital of Germany; its river is the Spree. " * 6,
    "x",
]


def weights_digest(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("model.safetensors", "1_Dense/model.safetensors"):
        digest.update((model_dir / name).read_bytes())
    return digest.hexdigest()


def packed(vectors) -> dict:
    array = vectors.float().numpy().astype("<f4")
    return {"shape": list(array.shape), "base64": base64.b64encode(array.tobytes()).decode()}


def main(model_dir: str, out: str) -> None:
    import pylate
    from pylate import models, scores

    model = models.ColBERT(model_name_or_path=model_dir, device="cpu")
    queries = model.encode(QUERIES, is_query=True, convert_to_tensor=False, convert_to_numpy=False)
    documents = model.encode(DOCUMENTS, is_query=False, convert_to_tensor=False, convert_to_numpy=False)
    maxsim = [[float(scores.colbert_scores(q[None], d[None])[0, 0]) for d in documents] for q in queries]
    reference = {
        "pylate": pylate.__version__,
        "weights_sha256": weights_digest(Path(model_dir)),
        "queries": QUERIES,
        "documents": DOCUMENTS,
        "query_vectors": [packed(vectors) for vectors in queries],
        "document_vectors": [packed(vectors) for vectors in documents],
        "maxsim": maxsim,
    }
    Path(out).write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
