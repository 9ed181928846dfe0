"""The task read from a model's own files (scripts/task_inference.py), on every tiny model of
scripts/make_tiny_models.py, and the ambiguous cases named."""

import json

import pytest

from ts_compiled_handlers.configuration.config import TASKS
from ts_compiled_handlers.scripts.make_tiny_models import MAKERS
from ts_compiled_handlers.scripts.task_inference import AmbiguousTask, infer_task


def expected_task(name: str) -> str:
    """A tiny model's task, from its name: the rerankers' are their files', the others' names say it."""
    if name in ("cross-encoder", "reranker-causal-chat"):  # the second saved by CrossEncoder (LogitScore)
        return "text-classification"
    if name == "reranker-causal":  # a bare causal LM: never guessed to be a reranker (--task decides)
        return "text-generation"
    if name == "colbert":  # saved in PyLate's layout
        return "multi-vector"
    if name == "m3":  # bge-m3's heads beside the encoder
        return "m3-embedding"
    return next(task for task in sorted(TASKS, key=len, reverse=True) if name.startswith(task))


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_every_tiny_model_is_inferred_its_task(tiny_models, name):
    assert infer_task(tiny_models[name]) == expected_task(name)


def test_a_bare_encoder_without_sentence_transformers_files_is_ambiguous(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(AmbiguousTask, match="pass --task, one of embedding"):
        infer_task(tmp_path)


def test_a_causal_lm_is_never_guessed_to_be_a_reranker(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    assert infer_task(tmp_path) == "text-generation"


def test_files_that_say_a_cross_encoder_or_a_sparse_encoder_decide(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "SparseEncoder"}))
    assert infer_task(tmp_path) == "sparse-embedding"
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder"}))
    assert infer_task(tmp_path) == "text-classification"
    # a causal LM saved by CrossEncoder (its LogitScore module): the files say reranker
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    assert infer_task(tmp_path) == "text-classification"
