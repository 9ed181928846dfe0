"""FlagEmbedding's answers for the test bge-m3 model (tests/data/flag_m3.json) and the checks that
ours equal them.

FlagEmbedding 1.4 needs transformers 4, so they are made in a venv of their own by
scripts/references/make.sh, for a model whose weights come from a fixed seed, checked by digest
before any comparison."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pylate_reference import vectors

REFERENCE = json.loads((Path(__file__).parent / "data" / "flag_m3.json").read_text())


def checked_model(folder: Path) -> Path:
    """`folder`, once its weights are those FlagEmbedding answered for (flag_m3.py's digest)."""
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes())
    for name in ("colbert_linear.pt", "sparse_linear.pt"):
        state = torch.load(folder / name, map_location="cpu", weights_only=True)
        for key in sorted(state):
            digest.update(key.encode() + state[key].float().numpy().astype("<f4").tobytes())
    message = "the test bge-m3 model changed: remake tests/data/flag_m3.json (scripts/references/make.sh)"
    assert digest.hexdigest() == REFERENCE["weights_sha256"], message
    return folder


def assert_close_vectors(got, wanted: torch.Tensor) -> None:
    """The same shape, every vector at cosine >= 0.9999 to FlagEmbedding's."""
    got = torch.tensor(np.array(got), dtype=torch.float32)
    assert got.shape == wanted.shape
    assert torch.nn.functional.cosine_similarity(got, wanted, dim=-1).min() >= 0.9999


def assert_equal_outputs(answers: list, texts: slice = slice(None)) -> None:
    """Each answer's dense vector, lexical weights and ColBERT vectors equal FlagEmbedding's `encode`."""
    dense = vectors(REFERENCE["dense_vecs"])[texts]
    weights, colbert = REFERENCE["lexical_weights"][texts], REFERENCE["colbert_vecs"][texts]
    assert len(answers) == len(dense) == len(weights) == len(colbert)
    for answer, vector, lexical, vectors_ in zip(answers, dense, weights, colbert, strict=True):
        assert_close_vectors(answer["dense_vecs"], vector)
        assert answer["lexical_weights"].keys() == lexical.keys()
        assert answer["lexical_weights"] == pytest.approx(lexical, abs=1e-4)
        assert_close_vectors(answer["colbert_vecs"], vectors(vectors_))
