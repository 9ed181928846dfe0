"""LoRA adapters served side by side (`handler.adapters`, handlers/graphs/lora.py): each adapter's
answers equal PEFT's merged model for it, in compiled batches that mix adapters and the base
model, with no recompile whatever the mix; bad adapters and unknown names refused."""

import json
import shutil

import pytest
import torch
from fakes import answered, ready_handler, status
from lora_reference import QUERY, TEXTS, cosine_at_least, embedder_with_adapters, ranker_with_adapters
from sentence_transformers import SentenceTransformer
from test_adapters import ask
from torch._dynamo.utils import counters

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.configuration.config_values import ConfigError
from ts_compiled_handlers.graphs import lora
from ts_compiled_handlers.scripts.build_mar import BuildError, build
from ts_compiled_handlers.worker.row_cache import RowCache

GRID = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}


@pytest.fixture(scope="module")
def embedder(tiny_models, tmp_path_factory):
    """The tiny embedder with two adapters in its folder, and sentence-transformers' answers for each."""
    folder, _, expected = embedder_with_adapters(tiny_models["embedding"], tmp_path_factory.mktemp("lora"))
    return folder, expected


def vectors(answer: list) -> torch.Tensor:
    return torch.tensor([item["embedding"] for item in answer])


def assert_equal_vectors(got: torch.Tensor, want: torch.Tensor) -> None:
    assert cosine_at_least(got, want) >= 0.9999


def test_a_compiled_batch_mixing_adapters_answers_each_as_peft_merged_it(embedder):
    folder, expected = embedder
    handler = ready_handler("embedding", folder, adapters=["one", "two"], **GRID)
    assert handler.engine.model.is_compiled and handler.engine.layout.adapters == 2
    assert not handler.engine.layout.packed  # adapter two adapts the pooler, a head
    graphs = counters["stats"]["unique_graphs"]
    for order in (["one", None, "two"], ["two", "two", None], [None, "one", "one"]):
        bodies = [{"inputs": TEXTS, **({"adapter": name} if name else {})} for name in order]
        for name, answer in zip(order, answered(handler, bodies), strict=True):
            assert_equal_vectors(vectors(answer), expected[name])
    for name in ("one", "two"):  # the adapters change the answers past the check: not the base model's vectors
        assert torch.nn.functional.cosine_similarity(expected[name], expected[None]).max() < 0.999
    assert counters["stats"]["unique_graphs"] == graphs  # no mix compiled anything
    assert handler.engine.model.recompiles_after_ready == 0


def test_adapters_inside_the_layers_keep_packed_rows(embedder):
    folder, expected = embedder
    handler = ready_handler("embedding", folder, adapters=["one"], compile={"enable": False}, **GRID)
    assert handler.engine.layout.packed and handler.engine.layout.adapters == 1
    mixed = answered(handler, [{"inputs": TEXTS[:2], "adapter": "one"}, {"inputs": TEXTS[:2]}])
    assert_equal_vectors(vectors(mixed[0]), expected["one"][:2])
    assert_equal_vectors(vectors(mixed[1]), expected[None][:2])


def test_unknown_adapters_are_refused_naming_the_served_ones_and_openai_names_them_after_the_archive(embedder):
    folder, expected = embedder
    handler = ready_handler("embedding", folder, adapters=["one", "two"], compile={"enable": False}, **GRID)
    bodies = [{"inputs": "hello", "adapter": "three"}, {"inputs": TEXTS[:2], "adapter": "one"}]
    refused, served = answered(handler, bodies)
    assert status(handler.context, 0) == 400 and "one, two" in refused["error"]
    assert_equal_vectors(vectors(served), expected["one"][:2])
    openai = [
        {"model": "test:two", "input": TEXTS},
        {"model": "test:nine", "input": "x"},
        {"model": "tst", "input": "x"},
    ]
    named, unknown, elsewhere = ask(handler, openai, ["v1/embeddings"] * 3)
    assert [status(handler.context, index) for index in range(3)] == [200, 400, 404]
    assert_equal_vectors(torch.tensor([item["embedding"] for item in named["data"]]), expected["two"])
    assert "one, two" in unknown["error"]["message"]
    (tei,) = ask(handler, [{"inputs": TEXTS, "adapter": "one"}], ["embed"])  # TEI's body takes it as a parameter
    assert status(handler.context, 0) == 200
    assert_equal_vectors(torch.tensor(tei), expected["one"])


def test_a_cross_encoders_adapters_score_as_peft_merged_them(tiny_models, tmp_path):
    folder, _, scores = ranker_with_adapters(tiny_models["cross-encoder"], tmp_path)
    handler = ready_handler("text-classification", folder, adapters=["one", "two"], **GRID)
    order = ["two", None, "one"]
    bodies = [{"query": QUERY, "documents": TEXTS, **({"adapter": name} if name else {})} for name in order]
    for name, answer in zip(order, ask(handler, bodies, ["rerank"] * 3), strict=True):
        got = {item["index"]: item["score"] for item in answer}
        assert [got[index] for index in range(len(TEXTS))] == pytest.approx(scores[name], abs=1e-4)
    assert scores["one"] != pytest.approx(scores[None], abs=1e-3)
    assert handler.engine.model.recompiles_after_ready == 0


def test_adapter_files_are_checked_like_weights(embedder, tmp_path):
    folder, _ = embedder
    source = folder / lora.FOLDER / "one"
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy2(source / lora.CONFIG_FILE, pickled)
    (pickled / "adapter_model.bin").write_bytes(b"not loaded")
    with pytest.raises(lora.AdapterError, match="pickle"):
        lora.read_adapter("pickled", pickled)
    dora = tmp_path / "dora"
    shutil.copytree(source, dora)
    config = json.loads((dora / lora.CONFIG_FILE).read_text())
    (dora / lora.CONFIG_FILE).write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(lora.AdapterError, match="use_dora"):
        lora.read_adapter("dora", dora)
    (dora / lora.CONFIG_FILE).write_text(json.dumps({"peft_type": "LORA", "lora_alpha": 8}))
    with pytest.raises(lora.AdapterError, match="no LoRA rank"):
        lora.read_adapter("rankless", dora)
    adapter = lora.read_adapter("one", source)
    wrong = lora.Adapter("wide", 1.0, {path: (a.repeat(1, 2), b) for path, (a, b) in adapter.factors.items()})
    with pytest.raises(lora.AdapterError, match="wide"):
        lora.attach(SentenceTransformer(str(folder), device="cpu")[0].auto_model, [wrong])


def test_build_carries_the_adapters_and_refuses_an_aot_package(embedder, tmp_path):
    folder, _ = embedder
    adapters = {"one": folder / lora.FOLDER / "one"}
    with pytest.raises(BuildError, match="AOT"):
        build(folder, "embedding", "aot", tmp_path, precompile="aot", adapters=adapters)
    import zipfile

    archive = build(
        folder, "embedding", "adapted", tmp_path, {"handler": {"compile": {"enable": False}}}, adapters=adapters
    )
    names = zipfile.ZipFile(archive).namelist()
    assert {"adapters/one/adapter_config.json", "adapters/one/adapter_model.safetensors"} <= set(names)


def test_the_key_is_checked_and_the_cache_tells_adapters_apart():
    assert parse({"handler": {"adapters": ["a", "b-2"]}}).adapters == ("a", "b-2") and parse({}).adapters == ()
    for bad in (["a", "a"], ["../x"], "a", [""]):
        with pytest.raises(ConfigError, match="handler.adapters"):
            parse({"handler": {"adapters": bad}})
    for task in ("text-generation", "image-text-embedding"):
        with pytest.raises(ConfigError, match="adapters serve text encoders"):
            parse({"handler": {"task": task, "adapters": ["a"]}})
    with pytest.raises(ConfigError, match="adapters serve text encoders"):
        parse({"handler": {"quantize": "int8", "adapters": ["a"]}})
    asked = []

    def compute(token_ids, type_ids, adapters):
        asked.extend(zip(map(tuple, token_ids), adapters, strict=True))
        return [torch.tensor([float(adapter)]) for adapter in adapters]

    rows, found = RowCache(1000).rows_for([[1, 2], [1, 2], [1, 2]], None, compute, [0, 1, 0])
    assert asked == [((1, 2), 0), ((1, 2), 1)] and found == 1  # the same ids under another adapter: computed
    assert [row.item() for row in rows] == [0.0, 1.0, 0.0]
