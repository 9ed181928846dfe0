"""AOT packages of the tiny models of every exporting task, in process: served without dynamo, with
eager's answers; refused, with the reason logged, when they do not match or are damaged."""

import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from fakes import build_aot_package, ready_handler

from ts_compiled_handlers.compiling import aot_package, compile_cache
from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.engine.runner import EagerRunner
from ts_compiled_handlers.runtime import hardware

GRID = {"buckets": {"seq_lens": [8, 16], "batch_sizes": [1, 2]}}
TASKS = ("embedding", "text-classification", "token-classification")


def packaged_copy(model_dir, target, task):
    """A copy of `model_dir` with the aot_package/ that `precompile.py ... aot` builds."""
    model = target / "model"
    shutil.copytree(model_dir, model)
    build_aot_package(task, model, {"handler": {"dtype": "float32", **GRID}})
    return model


@pytest.fixture(scope="module")
def packaged(tiny_models, tmp_path_factory) -> dict:
    return {task: packaged_copy(tiny_models[task], tmp_path_factory.mktemp(task), task) for task in TASKS}


def damaged_copy(packaged_model, tmp_path, damage) -> object:
    model = tmp_path / "model"
    shutil.copytree(packaged_model, model)
    damage(model / aot_package.PACKAGE_DIR)
    return model


@pytest.mark.parametrize("task", TASKS)
def test_every_exporting_task_serves_from_its_package_without_dynamo(packaged, task):
    handler = ready_handler(task, packaged[task], **GRID)
    engine = handler.engine
    assert handler.model_source == "aot package" and handler.started.cache_source == "aot"
    assert handler.started.report.shapes == 3  # each length at batch 1 (8, 16) and the largest batch
    assert compiled_graph_count() == 0  # warm-up, the check and these calls traced nothing
    eager = engine.on(EagerRunner(engine.model.eager))
    # The package's smallest and largest shapes (1 x 8, 2 x 16), one between, and one with padding.
    for token_ids in ([list(range(5, 9))], [list(range(5, 21))] * 2, [list(range(5, 15)), list(range(5, 9))]):
        for served, reference in zip(engine.run(token_ids).rows, eager.run(token_ids).rows, strict=True):
            torch.testing.assert_close(served, reference, atol=1e-5, rtol=1e-4)
    assert engine.model.recompiles_after_ready == 0


def test_a_packed_package_calls_the_per_text_attention_operator_and_says_so(packaged):
    """Its native code calls hfserve::text_attention (through AOTInductor's proxy executor), and its
    manifest records it, so that a worker loads the operator before the package, and only then."""
    packed = packaged["embedding"] / aot_package.PACKAGE_DIR
    with zipfile.ZipFile(packed / aot_package.PACKAGE_FILE) as package:
        calls = [name for name in package.namelist() if name.endswith(".wrapper.json")]
        assert calls and any(b'"target": "hfserve::text_attention"' in package.read(name) for name in calls)
    assert json.loads((packed / compile_cache.MANIFEST_FILE).read_text())["layout"]["per_text"] is True


def test_an_aot_start_loads_the_attention_operator_only_for_a_package_that_calls_it(packaged, tmp_path, monkeypatch):
    from ts_compiled_handlers.engine import native_ops

    def masked(packed):  # the manifest of a build that kept the block mask
        manifest = json.loads((packed / compile_cache.MANIFEST_FILE).read_text())
        manifest["layout"]["per_text"] = False
        (packed / compile_cache.MANIFEST_FILE).write_text(json.dumps(manifest))

    loads = []
    monkeypatch.setattr(native_ops, "load", lambda: loads.append(1) or True)  # loaded in this process already
    handler = ready_handler("embedding", damaged_copy(packaged["embedding"], tmp_path, masked), **GRID)
    assert handler.model_source == "aot package" and not handler.engine.layout.per_text and loads == []
    handler = ready_handler("embedding", packaged["embedding"], **GRID)
    assert handler.model_source == "aot package" and handler.engine.layout.per_text and loads == [1]


def test_a_shape_outside_the_bounds_is_answered_eagerly_and_counted(packaged):
    handler = ready_handler("embedding", packaged["embedding"], **GRID)
    model = handler.engine.model
    assert model.bounds == ((1, 2), (8, 16)) and handler.engine.layout.pack_budget == 16  # the package packs
    for batch, seq_len in ((3, 8), (1, 17)):  # the runtime would not check these shapes itself
        positions = torch.arange(seq_len).expand(batch, seq_len).contiguous()
        segments = torch.ones_like(positions)
        inputs = {"input_ids": torch.full((batch, seq_len), 7), "position_ids": positions, "segments": segments}
        with torch.inference_mode():
            torch.testing.assert_close(model(inputs), model.eager(**inputs))
    assert model.recompiles_after_ready == 2


def test_the_package_holds_code_and_reads_the_weights_from_the_archive(packaged):
    folder = packaged["embedding"] / aot_package.PACKAGE_DIR
    manifest = json.loads((folder / compile_cache.MANIFEST_FILE).read_text())
    assert manifest["valid_for"]["format"] == aot_package.FORMAT and manifest["valid_for"]["dynamic_threads"]
    assert "threads" not in manifest["valid_for"]
    weights = (packaged["embedding"] / "model.safetensors").stat().st_size
    assert manifest["files"][aot_package.PACKAGE_FILE]["bytes"] < weights + 4_000_000  # sized apart from the weights
    assert {file for file, _ in manifest["weights"].values()} == {"model.safetensors"}
    handler = ready_handler("embedding", packaged["embedding"], **GRID)
    assert not handler.engine.model.eager_loaded  # the worker started without building the model
    # Every parameter comes from the archive's safetensors; only buffers it leaves out ship apart.
    module = handler.engine.model.eager
    assert set(manifest["weights"]) == set(dict(module.named_parameters()))
    assert set(manifest["built"]["constants_in_package"]) <= set(dict(module.named_buffers()))


def test_an_auto_archive_whose_build_kept_float32_serves_from_its_float32_package(packaged, monkeypatch):
    """`dtype: auto` where the build's drift check refused the hardware's bfloat16: the package is
    float32, and a worker on that hardware serves it (it asked for a bfloat16 one and compiled)."""
    bfloat16_cpu = hardware.Hardware("cpu", "cpu", None, False, frozenset({"avx512_bf16"}))
    monkeypatch.setattr(hardware, "detect", lambda: bfloat16_cpu)
    assert hardware.detect().auto_dtype == torch.bfloat16
    handler = ready_handler("embedding", packaged["embedding"], **{**GRID, "dtype": "auto"})
    assert handler.model_source == "aot package" and handler.engine.dtype == torch.float32
    assert compiled_graph_count() == 0


def test_the_eager_model_loaded_later_lends_the_package_its_weights(packaged):
    handler = ready_handler("embedding", packaged["embedding"], **GRID)
    engine = handler.engine
    with torch.inference_mode():
        before = engine.run([list(range(5, 12))]).rows[0]
        # The runner now reads the eager model's own tensors: changing one changes the package's answers.
        engine.model.eager.module.encoder.embeddings.word_embeddings.weight.mul_(2)
        after = engine.run([list(range(5, 12))]).rows[0]
    assert engine.model.constants is None and not torch.allclose(before, after)


def test_an_aot_start_imports_neither_dynamo_nor_the_transformers_model(packaged):
    """Dynamo and transformers' model classes are most of a worker's imports (docs/design.md,
    "Cold start and AOT packages")."""
    # TorchServe's base handler imports openvino.torch where OpenVINO is installed (the [anchors]
    # extra), and that imports dynamo: not this package's doing, so the child cannot find it.
    script = f"""
import json, sys
sys.modules["openvino.torch"] = None
from fakes import make_context
from ts_compiled_handlers.servers.torchserve.handler import Handler
handler = Handler()
handler.initialize(make_context({str(packaged["embedding"])!r}, {{"handler": {{"dtype": "float32", **{GRID!r}}}}}))
heavy = ("torch._dynamo", "torch._inductor.compile_fx", "transformers.modeling_utils")
print(json.dumps({{"source": handler.model_source, "imported": [name for name in heavy if name in sys.modules]}}))
"""
    tests = Path(__file__).parents[1]
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(tests)},  # the tests' helpers (fakes); the package is installed
    )
    assert json.loads(result.stdout.splitlines()[-1]) == {"source": "aot package", "imported": []}


def other_dtype(folder):
    path = folder / compile_cache.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["valid_for"]["dtype"] = "bfloat16"
    path.write_text(json.dumps(manifest))


def truncated(folder):
    package = folder / aot_package.PACKAGE_FILE
    package.write_bytes(package.read_bytes()[:1000])


def other_weights(folder):
    """The archive's weights changed after the build: the package runs, with other answers."""
    from safetensors.torch import load_file, save_file

    path = folder.parent / "model.safetensors"
    tensors = load_file(str(path))
    tensors["embeddings.word_embeddings.weight"] *= 2
    save_file(tensors, str(path))


def garbage_with_its_checksum(folder):
    """Bytes that pass the checksum (the manifest was rewritten to match) but are not a package."""
    package = folder / aot_package.PACKAGE_FILE
    package.write_bytes(b"not a zip" * 100)
    path = folder / compile_cache.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["files"][aot_package.PACKAGE_FILE]["sha256"] = compile_cache.file_digest(package)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "damage, reason",
    [
        (other_dtype, "built for another setup; dtype: packed 'bfloat16', this worker 'float32'"),
        (truncated, "model.pt2 is missing, truncated or corrupt (sha256 mismatch)"),
        (garbage_with_its_checksum, "the package does not load"),
        (other_weights, "AOT package vs the build's eager: outputs drift"),
    ],
)
def test_a_package_that_does_not_fit_is_ignored_and_the_worker_compiles(packaged, tmp_path, caplog, damage, reason):
    model = damaged_copy(packaged["embedding"], tmp_path, damage)
    with caplog.at_level(logging.INFO):
        handler = ready_handler("embedding", model, **GRID)
    assert "AOT package IGNORED, compiling instead" in caplog.text and reason in caplog.text
    assert handler.model_source == "compiled" and compiled_graph_count() == 1


def test_an_export_that_specializes_a_lone_row_serves_it_beside_a_copy(tiny_models, tmp_path, monkeypatch, caplog):
    """CUDA's attention on torch 2.11 guards the batch against 1 (benchmarks/gpu_check.py on an H200):
    export refuses a batch dimension from 1, so the package serves batches from 2 and pads a lone row."""
    from torch._dynamo.exc import UserError, UserErrorType

    export = torch.export.export
    grid = {"buckets": {"seq_lens": [8, 16], "batch_sizes": [1, 4]}}  # batches 2 to 4: a dynamic dimension

    def specializing(module, args, kwargs, dynamic_shapes, strict):
        if 0 in dynamic_shapes["input_ids"] and dynamic_shapes["input_ids"][0].min == 1:
            raise UserError(UserErrorType.CONSTRAINT_VIOLATION, "batch: the guard L['input_ids'].size()[0] != 1.")
        return export(module, args, kwargs, dynamic_shapes=dynamic_shapes, strict=strict)

    monkeypatch.setattr(torch.export, "export", specializing)
    model = tmp_path / "model"
    shutil.copytree(tiny_models["embedding"], model)
    with caplog.at_level(logging.WARNING):
        build_aot_package("embedding", model, {"handler": {"dtype": "float32", **grid}})
    monkeypatch.undo()
    assert "The export specializes a batch of one: the package serves batches from 2" in caplog.text
    manifest = json.loads((model / aot_package.PACKAGE_DIR / compile_cache.MANIFEST_FILE).read_text())
    assert manifest["min_batch"] == 2
    handler = ready_handler("embedding", model, **grid)
    engine = handler.engine
    assert handler.model_source == "aot package" and engine.model.min_batch == 2
    eager = engine.on(EagerRunner(engine.model.eager))
    for token_ids in ([list(range(5, 9))], [list(range(5, 21))], [list(range(5, 15))] * 3):
        served, reference = engine.run(token_ids).rows, eager.run(token_ids).rows
        assert len(served) == len(token_ids)
        for row, expected in zip(served, reference, strict=True):
            torch.testing.assert_close(row, expected, atol=1e-5, rtol=1e-4)
    assert engine.model.recompiles_after_ready == 0 and compiled_graph_count() == 0
