"""An embedder's modules after its pooling (Dense, Normalize: handlers/graphs/sentence_head.py)
answered as sentence-transformers' `encode` answers them, compiled and packed, kept token states
pooled through them too; a module that is not served refused by name; an archive's int8 answer
ranges measured on the vectors it serves, left-padding tokenizers included."""

import json
import shutil

import numpy as np
import pytest
import torch
from fakes import answered, ready_handler
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.graphs.pooling import unit_rows
from ts_compiled_handlers.graphs.sentence_head import read_head
from ts_compiled_handlers.scripts.answer_ranges import embedded_texts
from ts_compiled_handlers.scripts.make_tiny_models import DENSE_SIZE

GRID = {"seq_lens": [16, 64], "batch_sizes": [1, 4]}
TEXTS = ["alice walks to paris quickly", "the cat sat on the red mat in berlin " * 4, "hello"]
EAGER = {"buckets": GRID, "compile": {"enable": False}, "dtype": "float32"}


def least_cosine(answers: list[dict], reference) -> float:
    got = torch.tensor([answer["embedding"] for answer in answers])
    return torch.nn.functional.cosine_similarity(got, torch.as_tensor(reference), dim=1).min().item()


def with_modules(source, target, reorder) -> object:
    """A copy of `source` whose modules.json is `reorder(modules)`."""
    shutil.copytree(source, target)
    modules = json.loads((target / "modules.json").read_text())
    (target / "modules.json").write_text(json.dumps(reorder(modules)))
    return target


def test_a_dense_module_is_served_compiled_and_packed_as_encode_answers(tiny_models):
    folder = tiny_models["embedding-dense"]
    head = read_head(folder)
    assert head.size == DENSE_SIZE and head.normalizes and len(head.layers) == 1
    handler = ready_handler("embedding", folder, buckets=GRID, dtype="float32")
    assert handler.engine.model.is_compiled and handler.engine.layout.packed
    graphs = compiled_graph_count()
    (answers,) = answered(handler, [{"inputs": TEXTS}])
    assert {len(answer["embedding"]) for answer in answers} == {DENSE_SIZE}
    reference = SentenceTransformer(str(folder), device="cpu")
    assert least_cosine(answers, reference.encode(TEXTS)) > 0.9999
    (raw,) = answered(handler, [{"inputs": TEXTS, "normalize": False}])  # the last Normalize is the toggle
    raw = np.array([answer["embedding"] for answer in raw])
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1)
    np.testing.assert_allclose(unit_rows(raw), [answer["embedding"] for answer in answers], atol=1e-6)
    assert compiled_graph_count() == graphs and handler.engine.model.recompiles_after_ready == 0


def test_token_states_kept_are_pooled_through_the_dense_module(tiny_models):
    folder = tiny_models["embedding-dense"]
    handler = ready_handler("embedding", folder, **EAGER, embedding={"embed_all": True})
    (answers,) = answered(handler, [{"inputs": TEXTS}])
    assert least_cosine(answers, SentenceTransformer(str(folder), device="cpu").encode(TEXTS)) > 0.9999


def test_a_normalize_before_a_dense_and_pickled_dense_weights_are_read_as_encode_reads_them(tiny_models, tmp_path):
    def normalize_first(modules):
        pooling, dense, normalize = modules[1:]
        return [modules[0], pooling, normalize, dense]

    folder = with_modules(tiny_models["embedding-dense"], tmp_path / "model", normalize_first)
    dense = folder / "2_Dense"
    torch.save(load_file(str(dense / "model.safetensors")), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()
    head = read_head(folder)
    assert not head.normalizes and len(head.layers) == 2  # the Normalize is part of the model now
    handler = ready_handler("embedding", folder, **EAGER)
    (answers,) = answered(handler, [{"inputs": TEXTS}])
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    np.testing.assert_allclose([answer["embedding"] for answer in answers], reference, atol=1e-5)


@pytest.mark.parametrize(
    "change, refusal",
    [
        (
            lambda modules, dense: modules.insert(3, {"path": "", "type": "sentence_transformers.models.LayerNorm"}),
            "sentence_transformers.models.LayerNorm after the pooling is not served",
        ),
        (lambda modules, dense: dense.update(activation_function="os.system"), "'os.system' is not a torch.nn module"),
        (
            lambda modules, dense: dense.update(module_input_name="token_embeddings"),
            "module_input_name 'token_embeddings'",
        ),
    ],
)
def test_what_is_not_served_after_the_pooling_is_refused_by_name(tiny_models, tmp_path, change, refusal):
    folder = with_modules(tiny_models["embedding-dense"], tmp_path / "model", lambda modules: modules)
    modules = json.loads((folder / "modules.json").read_text())
    dense = json.loads((folder / "2_Dense" / "config.json").read_text())
    change(modules, dense)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "2_Dense" / "config.json").write_text(json.dumps(dense))
    with pytest.raises(ValueError, match=refusal):
        read_head(folder)


@pytest.mark.parametrize("model", ["embedding-dense", "embedding-decoder"])
def test_answer_ranges_are_measured_on_the_vectors_the_archive_serves(tiny_models, model):
    """The decoder embedder's tokenizer pads on the left: its last token must still be the text's."""
    folder = tiny_models[model]
    texts = [f"text number {index} " * (1 + index % 5) for index in range(12)]
    measured = embedded_texts(folder, texts, parse({}))
    order = sorted(range(len(texts)), key=lambda index: len(texts[index]))  # embedded_texts sorts by length
    reference = SentenceTransformer(str(folder), device="cpu").encode([texts[index] for index in order])
    cosines = torch.nn.functional.cosine_similarity(torch.tensor(measured), torch.tensor(reference), dim=1)
    assert cosines.min().item() > 0.9999


def test_do_lower_case_lowercases_what_is_tokenized_as_encode_does(tiny_models, tmp_path):
    folder = tmp_path / "model"  # a cased tokenizer (the tiny BERT's lowercases by itself)
    shutil.copytree(tiny_models["embedding-decoder"], folder)
    settings = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps({**settings, "do_lower_case": True}))
    texts = ["Alice Walks To PARIS", "the CAT sat"]
    cased = ready_handler("embedding", tiny_models["embedding-decoder"], **EAGER)
    assert cased.tokenize(texts).token_ids != cased.tokenize([text.lower() for text in texts]).token_ids
    handler = ready_handler("embedding", folder, **EAGER)
    (answers,) = answered(handler, [{"inputs": texts}])
    reference = SentenceTransformer(str(folder), device="cpu").encode(texts)
    np.testing.assert_allclose([answer["embedding"] for answer in answers], reference, atol=1e-5)
    (lowered,) = answered(handler, [{"inputs": [text.lower() for text in texts]}])
    assert lowered == answers
