"""Text and token classification in process, compiled, against transformers pipelines in float32."""

from types import SimpleNamespace

import pytest
from fakes import answered, ready_handler, status
from parity import assert_same_answers
from rerank_shapes import (
    assert_bad_bodies_are_refused_alone,
    assert_cohere_clients_read_the_ranking,
    assert_every_shape_ranks_as_rerank,
)
from sentence_transformers import CrossEncoder
from transformers import pipeline

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.tasks.classification import ClassificationTask

GRID = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
TEXTS = ["alice walks to paris quickly", "the cat sat on the red mat in berlin", "Ünïcode bob, zzz!", "hello"]


def ask(handler, bodies):
    return answered(handler, bodies)


@pytest.fixture(scope="module")
def single_label(tiny_models):
    return ready_handler("text-classification", tiny_models["text-classification"], buckets=GRID)


def test_classification_compiles_the_grid_once_and_never_again(single_label):
    graphs = compiled_graph_count()
    assert (
        graphs == single_label.worker.task.graphs_needed(single_label.engine.plan) == 1
    )  # batch and length dynamic, batch 1 included
    ask(single_label, [{"inputs": text} for text in TEXTS] + [{"inputs": TEXTS}])
    assert compiled_graph_count() == graphs and single_label.engine.model.recompiles_after_ready == 0


@pytest.mark.parametrize("top_k", [1, 2, None])
def test_classification_matches_the_pipeline(single_label, tiny_models, top_k):
    reference = pipeline("text-classification", model=str(tiny_models["text-classification"]))
    assert single_label.engine.layout.pack_budget == 32  # the answers below come from packed rows
    answers = ask(single_label, [{"inputs": TEXTS[0], "top_k": top_k}, {"inputs": TEXTS, "top_k": top_k}])
    assert_same_answers(answers[0], reference(TEXTS[0], top_k=top_k))
    assert_same_answers(answers[1], reference(TEXTS, top_k=top_k))


def test_default_top_k_is_the_best_label(single_label, tiny_models):
    reference = pipeline("text-classification", model=str(tiny_models["text-classification"]))
    assert_same_answers(ask(single_label, [{"inputs": TEXTS[1]}])[0], reference(TEXTS[1]))


def test_multi_label_scores_are_sigmoids(tiny_models):
    folder = tiny_models["text-classification-multi-label"]
    handler = ready_handler("text-classification", folder, buckets=GRID, compile={"enable": False})
    answer = ask(handler, [{"inputs": TEXTS, "top_k": None}])[0]
    assert_same_answers(answer, pipeline("text-classification", model=str(folder))(TEXTS, top_k=None))
    assert abs(sum(item["score"] for item in answer[0]) - 1.0) > 1e-3  # not a softmax


def test_bad_top_k_gets_400_and_the_rest_of_the_batch_is_answered(single_label):
    answers = ask(single_label, [{"inputs": "the cat"}, {"inputs": "the cat", "top_k": -1}, {"inputs": "x", "k": 1}])
    assert [status(single_label.context, i) for i in range(3)] == [200, 400, 400]
    assert "top_k" in answers[1]["error"] and "unknown parameter" in answers[2]["error"]
    assert answers[0][0]["label"] in {"NEGATIVE", "NEUTRAL", "POSITIVE"}


def test_every_rerank_shape_answers_the_cross_encoders_scores(tiny_models):
    """Ours, TEI's `rerank`, Cohere's and Jina's `v1/rerank`, Cohere's `v2/rerank` (and its client)."""
    folder = tiny_models["cross-encoder"]
    handler = ready_handler("text-classification", folder, buckets=GRID, compile={"enable": False})
    query = "where does alice walk"
    expected = CrossEncoder(str(folder), device="cpu").predict([(query, text) for text in TEXTS])
    scores = assert_every_shape_ranks_as_rerank(handler, query, TEXTS, {})
    assert [scores[index] for index in range(len(TEXTS))] == pytest.approx(expected.tolist(), abs=1e-4)
    assert_cohere_clients_read_the_ranking(handler, query, TEXTS, {}, scores)
    assert_bad_bodies_are_refused_alone(handler, query, TEXTS)


@pytest.fixture(scope="module")
def token_handler(tiny_models):
    return ready_handler("token-classification", tiny_models["token-classification"], buckets=GRID)


@pytest.mark.parametrize("aggregation", ["none", "simple"])
def test_token_classification_matches_the_pipeline(token_handler, tiny_models, aggregation):
    reference = pipeline("token-classification", model=str(tiny_models["token-classification"]))
    assert token_handler.engine.layout.pack_budget == 32  # the answers below come from packed rows
    answers = ask(token_handler, [{"inputs": text, "aggregation_strategy": aggregation} for text in TEXTS])
    for text, answer in zip(TEXTS, answers, strict=True):
        assert_same_answers(answer, reference(text, aggregation_strategy=aggregation))
    assert any(answers), "the random model should tag some tokens with a non-O label"
    assert token_handler.engine.model.recompiles_after_ready == 0


def test_token_classification_list_in_list_out_and_unknown_strategy(token_handler):
    answers = ask(token_handler, [{"inputs": TEXTS[:2]}, {"inputs": "x", "aggregation_strategy": "first"}])
    assert len(answers[0]) == 2 and all(isinstance(entities, list) for entities in answers[0])
    assert status(token_handler.context, 1) == 400 and "none, simple" in answers[1]["error"]


@pytest.mark.parametrize(
    "saved, in_config, model",
    [
        (None, None, "cross-encoder"),  # nothing named: sigmoid for one label
        (None, None, "text-classification"),  # ... and none for three
        ("torch.nn.modules.activation.Tanh", "torch.nn.Sigmoid", "cross-encoder"),  # the ST file wins
        (None, "torch.nn.Identity", "cross-encoder"),  # config.json's sentence_transformers key
        ("mypackage.Activation", "torch.nn.Tanh", "cross-encoder"),  # an untrusted name is skipped, as there
        ("mypackage.Activation", None, "text-classification"),
    ],
)
def test_the_cross_encoder_activation_is_the_one_cross_encoder_picks(tiny_models, tmp_path, saved, in_config, model):
    import json

    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoConfig, AutoTokenizer

    folder = tmp_path / "model"
    CrossEncoder(str(tiny_models[model]), device="cpu").save(str(folder))  # its own layout, modules.json too
    config = json.loads((folder / "config.json").read_text())
    if in_config:
        config["sentence_transformers"] = {"activation_fn": in_config}
    (folder / "config.json").write_text(json.dumps(config))
    saved_file = json.loads((folder / "config_sentence_transformers.json").read_text())
    saved_file["activation_fn"] = saved
    (folder / "config_sentence_transformers.json").write_text(json.dumps(saved_file))
    task = ClassificationTask(parse({}))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    task.read_settings(
        SimpleNamespace(model_dir=folder, model_config=AutoConfig.from_pretrained(folder), tokenizer=tokenizer)
    )
    logits = torch.tensor([[-2.0, 0.5, 3.0]])
    assert torch.allclose(task.rerank_scores(logits), CrossEncoder(str(folder), device="cpu").activation_fn(logits))
