"""The architecture families served, each on a tiny random model made here: the path it takes (packed
rows or length groups), compiled with nothing compiled after ready, its answers equal to its
reference library's, and its AOT package served. The README's table of families is these results."""

import json
import shutil

import pytest
import torch
from fakes import Frontend, answered, build_aot_package, make_context, ready_handler
from parity import assert_same_answers, generate_alone
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import pipeline

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.servers.torchserve.handler import Handler

GRID = {"buckets": {"seq_lens": [16, 64], "batch_sizes": [1, 4]}, "warmup": {"iterations": 1}}
TEXTS = ["alice walks to paris quickly", "the cat sat on the red mat in berlin " * 4, "hello"]
QUERY = "where does alice walk"
DOCUMENTS = ["alice walks to paris", "the cat sat on the mat", "bob runs to london with carol", "paris"]


def cosine(answers: list[dict], reference) -> float:
    got = torch.tensor([answer["embedding"] for answer in answers])
    return torch.nn.functional.cosine_similarity(got, torch.as_tensor(reference), dim=1).min().item()


def check_embedding(handler, model_dir) -> None:
    reference = SentenceTransformer(str(model_dir), device="cpu")
    plain = answered(handler, [{"inputs": TEXTS}])[0]
    assert cosine(plain, reference.encode(TEXTS, normalize_embeddings=True)) > 0.9999
    for prompt in handler.worker.task.prompts:  # the decoder embedder's and EmbeddingGemma's prompts
        prompted = answered(handler, [{"inputs": TEXTS, "prompt_name": prompt}])[0]
        assert cosine(prompted, reference.encode(TEXTS, prompt_name=prompt)) > 0.9999


def check_classification(handler, model_dir) -> None:
    reference = pipeline("text-classification", model=str(model_dir))
    assert_same_answers(answered(handler, [{"inputs": TEXTS, "top_k": None}])[0], reference(TEXTS, top_k=None))


def check_reranking(handler, model_dir) -> None:
    scores = CrossEncoder(str(model_dir), device="cpu").predict([(QUERY, doc) for doc in DOCUMENTS]).tolist()
    ranked = answered(handler, [{"query": QUERY, "documents": DOCUMENTS}])[0]
    assert [item["index"] for item in ranked] == sorted(range(len(scores)), key=lambda index: -scores[index])
    assert [item["score"] for item in sorted(ranked, key=lambda item: item["index"])] == pytest.approx(scores, abs=1e-4)


FAMILIES = {  # tiny model: (task, packed?, the check of its answers)
    "embedding-decoder": ("embedding", True, check_embedding),  # Qwen3: last token, causal packed rows
    "embedding-modernbert": ("embedding", True, check_embedding),  # rotary, local attention
    "embedding-gemma": ("embedding", True, check_embedding),  # EmbeddingGemma: sliding windows both ways, 2 Dense
    "cross-encoder": ("text-classification", True, check_reranking),  # BERT pairs: token types per segment
    "text-classification-deberta": ("text-classification", False, check_classification),  # its head: groups
    "text-classification-distilbert": ("text-classification", False, check_classification),  # its head: groups
    "text-classification-xlmr": ("text-classification", True, check_classification),  # positions past padding
}


# torch.compile here for two families; every family is compiled ahead of time below, the decoder
# embedder and the cross-encoder also with torch.compile through TorchServe
# (tests/integration/test_models_server.py), BERT in the task tests.
@pytest.mark.parametrize("family", ["embedding-modernbert", "text-classification-deberta"])
def test_a_family_compiles_once_serves_its_path_and_answers_as_its_library(tiny_models, family):
    task, packed, check = FAMILIES[family]
    handler = ready_handler(task, tiny_models[family], **GRID)
    graphs = compiled_graph_count()
    assert handler.engine.model.is_compiled and handler.engine.layout.packed is packed
    check(handler, tiny_models[family])
    assert compiled_graph_count() == graphs and handler.engine.model.recompiles_after_ready == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_is_served_from_its_aot_package(tiny_models, tmp_path, family):
    task, packed, check = FAMILIES[family]
    model = tmp_path / "model"
    shutil.copytree(tiny_models[family], model)
    build_aot_package(task, model, {"handler": {"dtype": "float32", **GRID}})
    handler = ready_handler(task, model, **GRID)
    assert handler.model_source == "aot package" and handler.engine.layout.packed is packed
    check(handler, tiny_models[family])
    assert handler.engine.model.recompiles_after_ready == 0


def test_a_gpt2_decoder_generates_as_generate_under_continuous_batching(tiny_models):
    """GPT-2's learned absolute positions through the slot cache: token-identical to `generate()`."""
    folder = tiny_models["text-generation-gpt2"]
    handler = Handler()
    config = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 2]}, "generation": {"max_new_tokens": 16}}
    yaml_config = {"continuousBatching": True, "handler": {"task": "text-generation", "dtype": "float32", **config}}
    handler.initialize(make_context(folder, yaml_config))
    front = Frontend(handler)
    prompts = {"a": "hello world, the cat", "b": "alice walks to paris and bob"}
    for name, prompt in prompts.items():
        front.submit(name, {"inputs": prompt, "max_new_tokens": 8})
    front.run()
    for name, prompt in prompts.items():
        assert json.loads(front.body(name))["generated_text"] == generate_alone(folder, prompt, 8)
    assert handler.engine.model.is_compiled and handler.engine.model.recompiles_after_ready == 0
    assert not handler.engine.model.freezes  # frozen, its decode step drifted from eager (GenerationTask.FREEZES)
