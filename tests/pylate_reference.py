"""PyLate's answers for the test ColBERT model (tests/data/pylate_colbert.json) and the check that
ours equal them.

PyLate pins older sentence-transformers and transformers than ours, so they are made in a venv of
their own by scripts/references/make.sh, for a model whose weights are the same on every machine
(MiniLM's and a seeded projection), checked by digest before any comparison."""

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

REFERENCE = json.loads((Path(__file__).parent / "data" / "pylate_colbert.json").read_text())


def checked_model(folder: Path) -> Path:
    """`folder`, once its weights are those PyLate answered for (the digest pylate_colbert.py takes)."""
    digest = hashlib.sha256()
    for name in ("model.safetensors", "1_Dense/model.safetensors"):
        digest.update((folder / name).read_bytes())
    message = "the test ColBERT model changed: remake tests/data/pylate_colbert.json (scripts/references/make.sh)"
    assert digest.hexdigest() == REFERENCE["weights_sha256"], message
    return folder


def vectors(packed: dict) -> torch.Tensor:
    values = np.frombuffer(base64.b64decode(packed["base64"]), dtype="<f4")
    return torch.tensor(values.reshape(packed["shape"]).copy())


def assert_equal_vectors(answers: list, references: list) -> None:
    """The same number of vectors per text, each at cosine >= 0.9999 to PyLate's."""
    for answer, reference in zip(answers, references, strict=True):
        got, wanted = torch.tensor(np.array(answer)), vectors(reference)
        assert got.shape == wanted.shape
        assert torch.nn.functional.cosine_similarity(got, wanted, dim=-1).min() >= 0.9999
