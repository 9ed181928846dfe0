"""`quantize: int8` (experimental, issue 57) in process on the tiny random models: served int8 and compiled
over the grid with no recompile, or refused by the gate as `compile.on_failure` says; the gate's
measure per task and its calibration texts; the build's flags; the int8 AOT package."""

import dataclasses
import json
import logging
import math
import re
import shutil
import types
import zipfile
from pathlib import Path

import fakes
import pytest
import torch
from fakes import answered, build_aot_package

from ts_compiled_handlers.compiling import aot_package, compile_cache
from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.configuration.config import ConfigError, parse
from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.quantizing import int8_search, quantizing
from ts_compiled_handlers.quantizing.calibration import (
    DEFAULT_TEXTS,
    MIN_TEXTS,
    CalibrationError,
    calibration_pairs,
    calibration_rows,
    calibration_texts,
)
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.cli import UserError
from ts_compiled_handlers.startup import aot_start, build_steps, warmup
from ts_compiled_handlers.startup.serving import Serving
from ts_compiled_handlers.tasks.classification import ClassificationTask
from ts_compiled_handlers.tasks.embedding import EmbeddingTask
from ts_compiled_handlers.worker.worker import Worker

GRID = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
LLM_GRID = {"seq_lens": [8, 32, 128], "batch_sizes": [1, 4]}  # some of the rendered calibration pairs fit


def quantized_linears(module: torch.nn.Module) -> int:
    """Dequantize-per-channel nodes left in the converted graph: one per int8 weight."""
    return sum("dequantize_per_channel" in str(node.target) for node in module.graph.nodes)


def int8_graph(module: torch.nn.Module) -> torch.fx.GraphModule:
    """The converted graph, inside its autocast where the rest runs in bfloat16."""
    return module.module if isinstance(module, quantizing.AroundInt8) else module


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_int8_engine_passes_its_gate_and_serves_compiled_without_recompiles(tiny_bert, dtype, caplog):
    # a loose gate: this test is about the serving path (the gate has its own test below)
    with caplog.at_level(logging.INFO):
        handler = fakes.ready_handler(
            "embedding", tiny_bert, buckets=GRID, quantize="int8", dtype=dtype, warmup={"tolerance": 0.5}
        )
    engine = handler.engine
    gate = engine.model.eager.int8_gate
    assert gate.last.measure == "least cosine" and gate.last.texts == len(DEFAULT_TEXTS)
    # the gate holds float32's answers, never its model: one model in memory; released once checked
    assert not any(isinstance(value, torch.nn.Module) for value in vars(gate).values())
    assert gate.rows == [] and gate.reference == []
    assert f"dtype {dtype} with int8 linears ({gate.last})" in caplog.text  # the ready line says what it measured
    assert "smoothed at alpha 0.6" in caplog.text
    assert str(engine.dtype) == f"torch.{dtype}"
    graph = int8_graph(engine.model.eager)
    assert isinstance(graph, torch.fx.GraphModule) and quantized_linears(graph) > 0
    assert isinstance(engine.model.eager, quantizing.AroundInt8) == (dtype == "bfloat16")
    assert engine.model.is_compiled
    graphs = compiled_graph_count()
    answers = answered(handler, [{"inputs": text} for text in ["the cat sat", "hello world " * 6, "a dog"]])
    assert all(len(answer["embedding"]) == 32 for answer in answers)
    assert compiled_graph_count() == graphs and engine.model.recompiles_after_ready == 0
    with pytest.raises(quantizing.QuantizationRefused, match="runs on the CPU, not cuda"):
        quantizing.int8_engine(dataclasses.replace(engine, device=torch.device("cuda")), gate, [], engine.dtype)


def made_to_drift(tiny_bert: Path, folder: Path, drifting) -> Path:
    """The tiny BERT made to lose its answers in int8 where `drifting(name)`: those linears 20x
    stronger (so they shape the embedding), each with one weight column of 1000 on a hidden channel
    the layer norms zero. float32 never reads that column; per-channel int8 scales each row by it,
    and the row's other weights round to 0. Smoothing moves that column back out of the weights (its
    input channel is always 0), so the gate's tests turn it off: `UNSMOOTHED`."""
    from transformers import AutoModel

    shutil.copytree(tiny_bert, folder)
    model = AutoModel.from_pretrained(folder)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight[0] = module.bias[0] = 0
            elif isinstance(module, torch.nn.Linear) and drifting(name):
                module.weight.mul_(20)
                module.weight[:, 0] = 1000
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def drifting_bert(tiny_bert, tmp_path_factory) -> Path:
    """Every linear but the residual projections drifts: more than half the weights."""
    return made_to_drift(tiny_bert, tmp_path_factory.mktemp("drifting") / "model", lambda name: "output" not in name)


ONE_DRIFTING = "encoder.layer.0.intermediate.dense"  # the one linear of `one_drifting_bert` int8 moves far


UNSMOOTHED = {"smoothing": 0}


def test_the_gate_refuses_a_drifting_int8_model_and_serves_its_dtype_or_fails_as_configured(drifting_bert):
    handler = fakes.ready_handler("embedding", drifting_bert, buckets=GRID, quantize="int8", **UNSMOOTHED)
    assert not isinstance(handler.engine.model.eager, torch.fx.GraphModule)
    refused = fakes.ready_handler("embedding", drifting_bert, **EAGER_INT8, dtype="bfloat16", **UNSMOOTHED)
    assert refused.engine.dtype == torch.bfloat16 and refused.engine.model.int8_gate is None
    assert {p.dtype for p in refused.engine.model.eager.parameters()} == {torch.bfloat16}  # cast once refused
    with pytest.raises(
        quantizing.QuantizationRefused, match="least cosine .* linears that hurt most .* int8 would not pay"
    ):
        fakes.ready_handler(
            "embedding", drifting_bert, buckets=GRID, quantize="int8", compile={"on_failure": "fail"}, **UNSMOOTHED
        )
    # smoothed (the default), the outlier column leaves the weights and the same model passes the gate
    strict = {**EAGER_INT8, "compile": {"enable": False, "on_failure": "fail"}}
    smoothed = fakes.ready_handler("embedding", drifting_bert, **strict)
    assert smoothed.engine.model.int8_gate.last.value >= 1 - quantizing.DEFAULT_TOLERANCE


def test_auto_quantizes_only_where_the_cpu_has_vnni_and_keeps_float32_when_refused(drifting_bert, monkeypatch, caplog):
    strict = {**EAGER_INT8, **UNSMOOTHED, "quantize": "auto", "compile": {"enable": False, "on_failure": "fail"}}
    monkeypatch.setattr(quantizing, "has_vnni", lambda: False)
    with caplog.at_level(logging.INFO):
        handler = fakes.ready_handler("embedding", drifting_bert, **strict)
    assert not isinstance(handler.engine.model.eager, torch.fx.GraphModule)
    assert "quantize: auto keeps float32: this CPU has neither VNNI nor AMX" in caplog.text
    monkeypatch.setattr(quantizing, "has_vnni", lambda: True)  # tried now, and refused by its gate: not a failure
    handler = fakes.ready_handler("embedding", drifting_bert, **strict)
    assert not isinstance(handler.engine.model.eager, torch.fx.GraphModule)
    assert "quantize: auto keeps float32: int8 vs float32: least cosine" in caplog.text


def test_a_plan_whose_longest_length_holds_one_row_a_call_is_quantized_dynamic_in_batch(tiny_bert):
    """`max_tokens` 32 over lengths 8 and 32: a call of 32 tokens holds one row. The export, traced on
    a call of one row, fixed the batch at 1, and every call of more rows failed its guard."""
    buckets = {"seq_lens": [8, 32], "batch_sizes": [1, 4], "max_tokens": 32}
    strict = {"compile": {"enable": False, "on_failure": "fail"}, "warmup": {"tolerance": 0.5}}
    handler = fakes.ready_handler("embedding", tiny_bert, buckets=buckets, quantize="int8", **strict)
    assert handler.engine.model.int8_gate is not None and handler.engine.plan.rows_for(32) == 1
    answers = answered(handler, [{"inputs": ["a cat", "a dog", "the sun", "moon"]}, {"inputs": "hello world " * 5}])
    assert [len(answer["embedding"]) for answer in [*answers[0], answers[1]]] == [32] * 5


@pytest.mark.parametrize("quantize, policy", [("auto", "fail"), ("int8", "eager"), ("int8", "fail")])
def test_a_compiled_int8_model_its_gate_refuses_is_served_without_int8_or_fails(
    tiny_bert, monkeypatch, caplog, quantize, policy
):
    """As configuration.md says: `auto` keeps the model as it is, `int8` follows on_failure: the
    model at its dtype without int8 (not the eager int8 one), or the worker fails."""
    check = quantizing.Int8Gate.check

    def refuse_compiled(gate, engine):
        if getattr(engine.model, "is_compiled", False):
            raise quantizing.QuantizationRefused("int8 vs float32: the compiled model, refused by this test")
        return check(gate, engine)

    monkeypatch.setattr(quantizing.Int8Gate, "check", refuse_compiled)
    monkeypatch.setattr(quantizing, "has_vnni", lambda: True)
    config = {"buckets": {"seq_lens": [8], "batch_sizes": [1, 2]}, "quantize": quantize, "dtype": "float32"}
    config |= {"compile": {"on_failure": policy}, "warmup": {"tolerance": 0.5}}
    if policy == "fail" and quantize == "int8":
        with pytest.raises(quantizing.QuantizationRefused, match="refused by this test"):
            fakes.ready_handler("embedding", tiny_bert, **config)
        return
    with caplog.at_level(logging.WARNING):
        handler = fakes.ready_handler("embedding", tiny_bert, **config)
    assert f"quantize: {quantize}: the model is built again without int8" in caplog.text
    model = handler.engine.model
    assert model.is_compiled and model.int8_gate is None
    assert not isinstance(int8_graph(model.eager), torch.fx.GraphModule)  # the model as loaded, not int8
    assert len(answered(handler, [{"inputs": "the cat sat"}])[0]["embedding"]) == 32


def rows(*values) -> list[torch.Tensor]:
    return [torch.tensor(value, dtype=torch.float32) for value in values]


FLOORS = quantizing.GateFloors(cosine=0.99, agreement=0.95)


def test_the_gate_measures_vectors_by_cosine_labels_by_agreement_and_one_score_by_pairwise_order():
    vectors = quantizing.figures(False, rows([1, 0], [0, 1]), rows([1, 0], [1, 1]), FLOORS)
    assert vectors.measure == "least cosine" and vectors.value == pytest.approx(2**-0.5) and vectors.floor == 0.99
    labels = quantizing.figures(True, rows([2, 1], [0, 3], [1, 0]), rows([2, 1], [0, 3], [0, 1]), FLOORS)
    assert labels.measure == "label agreement" and labels.value == pytest.approx(2 / 3) and labels.texts == 3
    tokens = quantizing.figures(True, rows([[1, 0], [0, 1]]), rows([[1, 0], [1, 0]]), FLOORS)
    assert tokens.measure == "label agreement" and tokens.value == pytest.approx(0.5)  # per token
    # scores 1 < 2 < 3 < 4 against 1 < 2 < 4 < 3: one of the six pairs swapped
    order = quantizing.figures(True, rows([1], [2], [3], [4]), rows([1], [2], [4], [3]), FLOORS)
    assert order.measure == "rank agreement" and order.value == pytest.approx(5 / 6)
    assert order.floor == 0.95 and "rank agreement 0.8333 over 4 calibration pairs" in str(order)


@pytest.mark.parametrize("labels, nan_row", [(False, [1, math.nan]), (True, [math.nan, 0]), (True, [math.inf])])
def test_an_answer_with_nan_or_infinity_never_passes_the_gate_nor_a_check(labels, nan_row):
    """min() and max() skip a NaN, argmax reads it as the largest: each measure would have passed these."""
    good = [1, 0] if len(nan_row) == 2 else [1]
    found = quantizing.figures(labels, rows(good, nan_row, good), rows(good, good, good), FLOORS)
    assert math.isnan(found.value)
    gate = quantizing.Int8Gate([[1], [2], [3]], rows(good, good, good), labels, FLOORS)
    broken = types.SimpleNamespace(run=lambda ids, type_ids=None: types.SimpleNamespace(rows=rows(good, nan_row, good)))
    with pytest.raises(quantizing.QuantizationRefused, match="an answer holds NaN or infinity"):
        gate.check(broken)
    with pytest.raises(warmup.WarmupError, match="drift inf"):
        warmup.check_drift("compiled vs eager", rows(good, nan_row, good), rows(good, good, good), 0.01)
    with pytest.raises(warmup.WarmupError, match="differ by inf"):
        warmup.check_error("packed vs alone", rows(good, nan_row, good), rows(good, good, good), 0.1)


def test_per_token_rows_are_gated_token_by_token():
    """A ColBERT or bge-m3 row is (tokens, values): one token turned around is a changed answer, which a
    cosine over the whole flattened row (0.8 here) would have passed at a loose floor."""
    wanted = torch.eye(10)  # ten tokens, each its own direction
    got = wanted.clone()
    got[3] = -got[3]
    found = quantizing.figures(False, [got], [wanted], FLOORS)
    assert found.measure == "least cosine" and found.value == pytest.approx(-1.0)
    flat = torch.nn.functional.cosine_similarity(got.flatten(), wanted.flatten(), dim=0).item()
    assert flat == pytest.approx(0.8)


def test_the_gate_s_floors_are_the_archive_s_tolerance_and_agreement():
    assert quantizing.floors(parse({})) == quantizing.GateFloors(1 - quantizing.DEFAULT_TOLERANCE, 0.95)
    tight = parse({"handler": {"agreement": 1, "warmup": {"tolerance": 0.002}}})
    assert quantizing.floors(tight) == quantizing.GateFloors(0.998, 1.0)
    order = quantizing.figures(True, rows([1], [2], [3]), rows([1], [3], [2]), quantizing.floors(tight))
    assert order.value < order.floor == 1.0


EAGER_INT8 = {"buckets": GRID, "quantize": "int8", "compile": {"enable": False}}  # the gate, without compiling


@pytest.mark.parametrize(
    "model, measure", [("text-classification", "label agreement"), ("cross-encoder", "rank agreement")]
)
def test_a_classifier_and_a_reranker_are_gated_by_their_answers_agreement(tiny_models, model, measure):
    handler = fakes.ready_handler("text-classification", tiny_models[model], **EAGER_INT8, agreement=0.9)
    gate = handler.engine.model.eager.int8_gate  # held to the archive's floor
    assert gate.last.measure == measure and gate.last.value >= gate.last.floor == gate.floors.agreement == 0.9
    assert quantized_linears(handler.engine.model.eager) > 0
    answers = answered(handler, [{"inputs": "the cat sat"}, {"inputs": "where does alice walk " * 8}])
    assert len(answers) == 2 and not any(isinstance(answer, dict) and "error" in answer for answer in answers)


def test_calibration_pairs_put_each_text_once_first_and_once_second_or_are_a_file_s_tab_separated_lines():
    texts = [f"text {i}" for i in range(5)]
    pairs = calibration_pairs(texts)
    assert [first for first, _ in pairs] == texts and sorted(second for _, second in pairs) == texts
    assert all(first != second for first, second in pairs)
    given = calibration_pairs(["where is it\tit is here ", "why\tbecause\tof this"])
    assert given == [("where is it", "it is here"), ("why", "because\tof this")]


def test_a_calibration_file_is_read_a_line_a_text_and_a_broken_pair_is_refused_by_its_number(tmp_path):
    lines = [f"query {index}\tdocument {index} \f with a form feed" for index in range(MIN_TEXTS)]
    (tmp_path / "pairs.txt").write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n\r\n").encode())
    texts = calibration_texts("pairs.txt", tmp_path)
    assert len(texts) == MIN_TEXTS and texts[0].startswith("query 0\tdocument 0")  # no BOM, no split at \f
    assert calibration_pairs(texts)[1] == ("query 1", "document 1 \f with a form feed")
    for broken in ("query 9\t", "query 9 without its document"):  # the tab of an empty document once stripped
        (tmp_path / "broken.txt").write_text("\n".join([*lines[:-1], broken]))
        with pytest.raises(CalibrationError, match=f"text {MIN_TEXTS} is not a query<TAB>document pair"):
            calibration_pairs(calibration_texts("broken.txt", tmp_path))


def test_a_reranker_is_calibrated_and_gated_on_pairs_with_their_token_types_which_its_package_keeps(tiny_models):
    # which pairs the gate reads, not its verdict: on a CPU without VNNI (7-bit activations) the random
    # tiny cross-encoder keeps 0.90 of its pairs' order, under the default floor of 0.95
    config = {"dtype": "float32", **EAGER_INT8, "agreement": 0.5}
    placement = Placement(tiny_models["cross-encoder"], "test", {"handler": config})
    task, serving, _ = Worker.read(placement, ClassificationTask)
    gate = build_steps.eager_engine(task, serving).model.int8_gate
    firsts, seconds = zip(*calibration_pairs(list(DEFAULT_TEXTS)), strict=True)
    wanted = serving.tokenizer(list(firsts), list(seconds), truncation=True, max_length=serving.plan.max_seq_len)
    assert gate.rows == wanted["input_ids"] and gate.type_ids == wanted["token_type_ids"]
    assert all(set(types) == {0, 1} for types in gate.type_ids) and gate.last.measure == "rank agreement"
    # an int8 package carries the pairs' types beside their ids, and a worker's gate reads them back
    calibration = aot_package.Reference(gate.rows, gate.reference, type_ids=gate.type_ids)
    read = aot_package.Reference.read(aot_package.Reference([[101, 102]], [torch.ones(1)], calibration).tensors())
    assert read.type_ids is None and read.calibration.token_ids == gate.rows
    assert read.calibration.type_ids == gate.type_ids


def test_an_llm_reranker_is_gated_on_the_pairs_its_chat_template_renders_uncut_as_it_serves(tiny_models):
    # which pairs the gate reads, not its verdict: a random tiny model's close scores swap under int8
    config = {"dtype": "float32", **EAGER_INT8, "buckets": LLM_GRID, "agreement": 0.5}
    placement = Placement(tiny_models["reranker-causal-chat"], "test", {"handler": config})
    task, serving, _ = Worker.read(placement, ClassificationTask)
    gate = build_steps.eager_engine(task, serving).model.int8_gate
    rendered = task.pair_texts(calibration_pairs(list(DEFAULT_TEXTS)))
    assert all(text.startswith("instruct: ") and "\nquery: " in text and "\ndocument: " in text for text in rendered)
    every = serving.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    wanted = [row for row in every if len(row) <= serving.plan.max_seq_len]  # a server refuses the others (413)
    assert 8 <= len(wanted) < len(every)
    assert gate.rows == wanted and gate.type_ids is None and gate.last.measure == "rank agreement"
    with pytest.raises(CalibrationError, match=r"0 of 40 calibration texts fit in 8 tokens uncut"):
        calibration_rows(serving.tokenizer, rendered, 8, task.tokenizer_options(), False)


def test_smoothing_keeps_the_product_moves_the_outlier_channel_and_is_undone_after_quantizing():
    linear = torch.nn.Linear(4, 3)
    tied, original = linear.weight, linear.weight.detach().clone()
    inputs = torch.randn(5, 4) * torch.tensor([1.0, 50.0, 1.0, 1.0])  # channel 1: an outlier
    module = torch.nn.Sequential(linear)
    before = module(inputs)
    with quantizing.input_ranges(module) as ranges:
        module(inputs)
    with quantizing.smoothed(module, ranges, 0.6) as count:
        assert count == 1 and isinstance(module[0], torch.nn.Linear)
        assert torch.allclose(module(inputs), before, atol=1e-4)
        assert (module[0].weight / original)[0].argmax() == 1  # the outlier channel moved into the weight most
        assert module[0].weight is not tied and torch.equal(tied, original)
    # afterwards (a model the gate refused serves on): the linear as it was, its tied weight, no division
    assert module[0].weight is tied and not module[0]._forward_pre_hooks and torch.equal(module(inputs), before)


def test_a_sparse_model_is_quantized_beside_bfloat16(tiny_models):
    # SPLADE's head casts its logits: export's dtype assertion after that cast failed under autocast
    config = {**EAGER_INT8, "dtype": "bfloat16", "warmup": {"tolerance": 0.5}}
    config["compile"] = {"enable": False, "on_failure": "fail"}
    handler = fakes.ready_handler("sparse-embedding", tiny_models["sparse-embedding"], **config)
    module = handler.engine.model.eager
    assert isinstance(module, quantizing.AroundInt8) and quantized_linears(int8_graph(module)) > 0
    assert module.int8_gate.last.measure == "least cosine"
    answers = answered(handler, [{"inputs": "the cat sat"}, {"inputs": "where does alice walk " * 8}])
    assert len(answers) == 2 and not any("error" in answer for answer in answers)


@pytest.fixture
def bert_with_texts(tiny_bert, tmp_path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_bert, folder)
    return folder


def test_the_archive_s_calibration_file_replaces_the_default_texts_and_too_few_are_refused(bert_with_texts):
    (bert_with_texts / "texts.txt").write_text("\n".join(f"text number {i} about cats" for i in range(10)) + "\n\n")
    handler = fakes.ready_handler("embedding", bert_with_texts, calibration="texts.txt", **EAGER_INT8)
    assert handler.engine.model.eager.int8_gate.last.texts == 10
    (bert_with_texts / "texts.txt").write_text("one\ntwo\n")
    strict = {**EAGER_INT8, "compile": {"enable": False, "on_failure": "fail"}}
    with pytest.raises(CalibrationError, match="texts.txt has 2 texts; give at least 8"):
        fakes.ready_handler("embedding", bert_with_texts, calibration="texts.txt", **strict)


def test_calibration_names_a_file_inside_the_archive_and_generation_is_not_quantized():
    assert parse({"handler": {"calibration": "data/texts.txt"}}).calibration == "data/texts.txt"
    for outside in ("/etc/passwd", "../texts.txt", ""):
        with pytest.raises(ConfigError, match="handler.calibration"):
            parse({"handler": {"calibration": outside}})
    with pytest.raises(ConfigError, match="none for text-generation"):
        parse({"handler": {"task": "text-generation", "quantize": "int8"}})
    with pytest.raises(ConfigError, match="handler.compile.regional.*false with quantize"):
        parse({"handler": {"quantize": "int8", "compile": {"regional": True}}})


def test_hfserve_build_quantize_and_calibration_carry_the_texts_into_the_archive(tiny_bert, tmp_path):
    texts = tmp_path / "my texts.txt"
    texts.write_text("\n".join(f"query {i}: where is the station" for i in range(12)))
    common = ["--model", str(tiny_bert), "--task", "embedding", "--export-path", str(tmp_path)]
    built = build_mar.main([*common, "--name", "q", "--quantize", "int8", "--calibration", str(texts)])
    with zipfile.ZipFile(built) as archive:
        assert archive.read(build_mar.CALIBRATION_FILE).decode() == texts.read_text()
        config = archive.read("model-config.yaml").decode()
    assert "quantize: int8" in config and f"calibration: {build_mar.CALIBRATION_FILE}" in config
    texts.write_text("just one\n")
    with pytest.raises(UserError, match="--calibration: .*my texts.txt has 1 texts"):
        build_mar.main([*common, "--name", "few", "--quantize", "int8", "--calibration", str(texts)])
    named_default = tmp_path / "default"  # a file, not the shipped set: checked as one
    named_default.write_text("just one\n")
    with pytest.raises(UserError, match="default has 1 texts"):
        build_mar.main([*common, "--name", "few", "--quantize", "int8", "--calibration", str(named_default)])
    config = tmp_path / "config.yaml"  # a file the model's folder does not carry into the archive
    config.write_text("handler:\n  quantize: int8\n  calibration: texts.txt\n")
    with pytest.raises(UserError, match="cannot read texts.txt in the archive.*give the file with --calibration"):
        build_mar.main([*common, "--name", "named", "--config", str(config)])


def test_int8_keeps_in_floating_point_only_the_linear_that_drifts_and_int8_all_is_refused(tiny_bert, tmp_path, caplog):
    model = made_to_drift(tiny_bert, tmp_path / "model", lambda name: name == ONE_DRIFTING)
    compiled = {"buckets": GRID, "quantize": "int8", "compile": {"on_failure": "fail"}, **UNSMOOTHED}
    with caplog.at_level(logging.INFO):
        handler = fakes.ready_handler("embedding", model, **compiled)  # gated eager, then compiled
    kept_one = handler.engine.model.eager
    assert handler.engine.model.is_compiled and kept_one.int8_gate.last.texts == len(DEFAULT_TEXTS)
    assert re.search(rf"kept float32: [\w.]*\.{re.escape(ONE_DRIFTING)};", caplog.text)  # in the layout's module
    assert "int8: 1 of 12 linears kept in floating point" in caplog.text  # BERT's pooler is out of the count
    graphs = compiled_graph_count()
    answers = answered(handler, [{"inputs": "the cat sat"}, {"inputs": "hello world " * 6}])
    assert all(len(answer["embedding"]) == 32 for answer in answers) and compiled_graph_count() == graphs
    every = fakes.ready_handler("embedding", tiny_bert, **{**EAGER_INT8, "quantize": "int8-all"}).engine.model.eager
    assert quantized_linears(every) == quantized_linears(kept_one) + 1  # the pooler's is dropped in both
    strict = {**EAGER_INT8, **UNSMOOTHED, "compile": {"enable": False, "on_failure": "fail"}}
    with pytest.raises(quantizing.QuantizationRefused, match="least cosine"):
        fakes.ready_handler("embedding", model, **{**strict, "quantize": "int8-all"})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_simulated_int8_measures_what_the_int8_model_measures(tiny_bert, tmp_path, monkeypatch, dtype):
    # the search's premise (handlers/quantizing/int8_search.py): the gate read on int8 simulated in
    # float32 (the rest at the model's dtype) is the gate read on the int8 model, so the kept
    # linears it picks pass for real
    model = made_to_drift(tiny_bert, tmp_path / "model", lambda name: name == ONE_DRIFTING)
    simulated = []

    def spy(engine, gate, example_rows, dtype, kept=(), smoothing=None):
        assert smoothing is None and kept == ()
        linears = {
            name: child for name, child in engine.model.eager.named_modules() if isinstance(child, torch.nn.Linear)
        }
        scales = {name: torch.ones(linear.in_features) for name, linear in linears.items()}
        simulation = int8_search._Simulation(engine, gate, scales, 255, dtype)
        simulated.append(simulation.gate_figures(simulation.answers(list(scales))))
        return real(engine, gate, example_rows, dtype, kept, smoothing)

    real = quantizing.int8_engine
    monkeypatch.setattr(quantizing, "has_vnni", lambda: True)
    monkeypatch.setattr(quantizing, "int8_engine", spy)
    config = {**EAGER_INT8, **UNSMOOTHED, "quantize": "int8-all", "warmup": {"tolerance": 0.9}, "dtype": dtype}
    measured = fakes.ready_handler("embedding", model, **config).engine.model.eager.int8_gate.last
    assert measured.value < 0.99  # int8 moved the answers: there is a drift to predict
    assert simulated[0].value == pytest.approx(measured.value, abs=int8_search.MARGIN * (1 - measured.value))


def test_an_int8_package_is_held_to_the_gate_s_allowance_against_the_build_s_int8_model():
    # its oneDNN kernels round otherwise than the eager quantize/dequantize pairs; the gate judges int8
    unused = [None] * (len(dataclasses.fields(Serving)) - 1)  # all but the config
    serving = Serving(parse({}), *unused)
    assert aot_start.allowance(serving, torch.bfloat16, int8=False) == warmup.AUTO_TOLERANCE[torch.bfloat16]
    assert aot_start.allowance(serving, torch.bfloat16, int8=True) == quantizing.DEFAULT_TOLERANCE
    loose = Serving(parse({"handler": {"warmup": {"tolerance": 0.3}}}), *unused)
    assert aot_start.allowance(loose, torch.bfloat16, int8=True) == 0.3


def test_an_int8_aot_package_holds_its_weights_serves_without_dynamo_and_is_gated_again(tiny_bert, tmp_path, caplog):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    config = {"buckets": GRID, "quantize": "int8", "dtype": "bfloat16", "warmup": {"tolerance": 0.5}}
    built = build_aot_package("embedding", model, {"handler": config})
    # frozen: the int8 weights are in the native code, none read from the checkpoint or shipped beside it
    assert built["constants_from_checkpoint"] == 0 and built["constants_in_package"] == []
    packed = model / aot_package.PACKAGE_DIR
    manifest = json.loads((packed / compile_cache.MANIFEST_FILE).read_text())
    assert manifest["frozen"] and manifest["valid_for"]["quantize"] == "int8"
    with caplog.at_level(logging.INFO):
        handler = fakes.ready_handler("embedding", model, **config)
    engine = handler.engine
    assert handler.model_source == "aot package" and compiled_graph_count() == 0
    gate = engine.model.int8_gate  # checked again here, against float32's answers the package carries
    assert gate.last.measure == "least cosine" and gate.last.texts == len(DEFAULT_TEXTS) and gate.rows == []
    assert f"dtype bfloat16 with int8 linears ({gate.last})" in caplog.text
    texts = ["the cat sat", "hello world " * 6, "a dog"]
    packaged = answered(handler, [{"inputs": text} for text in texts])
    assert compiled_graph_count() == 0 and not engine.model.eager_loaded
    # the same answers as the int8 model run eagerly (the same quantization of the same weights)
    eager = fakes.ready_handler("embedding", tiny_bert, **config, compile={"enable": False})
    for ours, theirs in zip(packaged, answered(eager, [{"inputs": text} for text in texts]), strict=True):
        cosine = torch.nn.functional.cosine_similarity(
            torch.tensor(ours["embedding"]), torch.tensor(theirs["embedding"]), dim=0
        )
        assert cosine > 0.99
    # the package carries the gate's texts and float32's answers; answers it drifts from are refused
    calibration = aot_package.Reference.load(packed / aot_package.REFERENCE_FILE).calibration
    assert len(calibration.token_ids) == len(calibration.rows) == len(DEFAULT_TEXTS)
    forged = aot_package.Reference(calibration.token_ids, [-row for row in calibration.rows])
    with pytest.raises(quantizing.QuantizationRefused, match="least cosine"):
        aot_start.check_int8_gate(engine, handler.worker.task, handler.serving, forged)
    # a worker configured without int8 (or with another recipe) does not take it
    for setting, other in [("quantize", "none"), ("quantize", "int8-all"), ("smoothing", 0.0)]:
        with pytest.raises(aot_package.PackageError, match=setting):
            aot_package.load(packed, {**manifest["valid_for"], setting: other}, model, torch.device("cpu"))


def test_an_int8_model_keys_this_host_s_compile_cache_apart_from_its_float_model(tiny_bert, tmp_path):
    """Same weights, same grid, another model: the float archive's cache is no hit for the int8 one."""
    keys = []
    for quantize in ("none", "int8", "int8-all"):
        handler_config = {"dtype": "float32", "quantize": quantize, "compile": {"cache_dir": str(tmp_path)}}
        placement = Placement(tiny_bert, "test", {"handler": handler_config})
        _, serving, _ = Worker.read(placement, EmbeddingTask)
        engine = types.SimpleNamespace(dtype=torch.float32, plan=serving.plan)
        valid_for = build_steps._host_cache(engine, serving).valid_for
        assert valid_for["quantize"] == quantize and valid_for["smoothing"] == 0.6
        keys.append(compile_cache.manifest_key(valid_for))
    assert len(set(keys)) == 3
