"""`hfserve build --model ORG/NAME`: a Hub id resolved from a local cache made here (never the network)."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REVISION = "0123456789abcdef0123456789abcdef01234567"


def cache_with(model_dir: Path, cache: Path, repo_id: str) -> Path:
    """A Hugging Face cache holding `model_dir` as `repo_id` at main, laid out as huggingface_hub lays it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(model_dir, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return cache


def hfserve_build(model: str, tmp_path: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "ts_compiled_handlers.scripts.cli", "build", "--model", model, "--model-name"]
    command += ["hub"]
    command += ["--export-path", str(tmp_path / "store"), *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


@pytest.mark.heavy  # starts a process
def test_a_hub_id_builds_from_the_local_cache(tiny_bert, tmp_path):
    cache = cache_with(tiny_bert, tmp_path / "hub-cache", "tiny-org/tiny-embedder")
    built = hfserve_build("tiny-org/tiny-embedder", tmp_path, cache)
    assert built.returncode == 0, built.stderr
    with zipfile.ZipFile(tmp_path / "store" / "hub.mar") as archive:
        names = archive.namelist()
    assert "model.safetensors" in names and "1_Pooling/config.json" in names and "sentence_bert_config.json" in names


@pytest.mark.heavy  # starts a process
def test_an_id_absent_from_the_cache_is_one_line_naming_it(tmp_path):
    (tmp_path / "hub-cache").mkdir()
    built = hfserve_build("tiny-org/not-here", tmp_path, tmp_path / "hub-cache")
    assert built.returncode == 1
    message = built.stderr.strip().splitlines()
    assert len(message) == 1 and "tiny-org/not-here" in message[0]
    assert "not in the local Hugging Face cache" in message[0] and "--allow-download" in message[0]
