import importlib
import io
import json
import zipfile

import pytest
import yaml
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import list_classes_from_module

from ts_compiled_handlers.runtime.package_files import HANDLER
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.build_mar import BuildError, build, check_model_dir


def test_refuses_a_model_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(BuildError, match="no .safetensors weights.*pytorch_model.bin"):
        check_model_dir(tmp_path)


def test_refuses_a_model_that_asks_for_remote_code(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "x.Y"}}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(BuildError, match="remote code"):
        check_model_dir(tmp_path)


def test_refuses_a_bad_config_at_build_time(tiny_bert, tmp_path):
    with pytest.raises(ValueError, match="handler.dtype='int8'"):
        build(tiny_bert, "embedding", "tiny", tmp_path, {"handler": {"dtype": "int8"}})


def test_archive_is_self_contained(tiny_bert, tmp_path):
    archive = build(tiny_bert, "embedding", "tiny", tmp_path, {"handler": {"dtype": "float32"}})
    with zipfile.ZipFile(archive) as mar:
        names = set(mar.namelist())
        config = yaml.safe_load(mar.read("model-config.yaml"))
        manifest = json.loads(mar.read("MAR-INF/MANIFEST.json"))
    assert {
        "handler.py",
        "ts_compiled_handlers/servers/torchserve/adapter.py",
        "ts_compiled_handlers/tasks/embedding.py",
        "ts_compiled_handlers/servers/torchserve/metrics.yaml",
        "model.safetensors",
    } <= names
    assert {"tokenizer.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json"} <= names
    assert config["handler"] == {"task": "embedding", "dtype": "float32"}
    assert manifest["model"]["handler"] == "handler.py"


def test_the_handler_file_defines_exactly_one_class_as_torchserve_reads_it():
    """TorchServe refuses a handler module that defines more than one class (ts/model_loader.py)."""
    module = importlib.import_module("ts_compiled_handlers." + HANDLER.removesuffix(".py").replace("/", "."))
    (found,) = list_classes_from_module(module)
    assert issubclass(found, BaseHandler) and found.__name__ == "Handler"


def archived_config(archive) -> dict:
    with zipfile.ZipFile(archive) as mar:
        return yaml.safe_load(mar.read("model-config.yaml"))


def test_a_startup_timeout_fitting_the_planned_start_is_written(tiny_bert, tmp_path, monkeypatch):
    from ts_compiled_handlers.startup import start_cost

    # 1 GFLOP/s at every dtype: the plan's passes count for seconds, whatever this host's rate
    monkeypatch.setattr(start_cost, "measured_rates", lambda width, dtypes: dict.fromkeys(dtypes, 1e9))
    whole = archived_config(build(tiny_bert, "embedding", "whole", tmp_path, {}))
    regional = {"handler": {"compile": {"regional": True}}}
    regional = archived_config(build(tiny_bert, "embedding", "regional", tmp_path, regional))
    layers = json.loads((tiny_bert / "config.json").read_text())["num_hidden_layers"]
    # One graph for dynamic: all; whole-model graphs cost per layer, regional ones per block.
    compiling = start_cost.COMPILE_FIXED_SECONDS + (
        start_cost.COMPILE_PER_GRAPH_SECONDS + start_cost.COMPILE_PER_LAYER_SECONDS * layers
    )
    planned = build_mar.estimated_compile_seconds(whole, tiny_bert)
    assert planned > compiling  # and the passes over the grid and the checks, at 1 GFLOP/s
    assert whole["startupTimeout"] >= build_mar.STARTUP_MARGIN * planned + build_mar.STARTUP_FIXED_SECONDS
    assert whole["startupTimeout"] % 10 == 0 and regional["startupTimeout"] >= build_mar.STARTUP_FLOOR_SECONDS
    assert build_mar.startup_timeout({}, 68, measured=True) == {"startupTimeout": 170}  # 2 x 68 + 30, rounded up


def test_a_grid_too_large_for_the_users_startup_timeout_is_warned_about(tiny_bert, tmp_path, capsys):
    config = {"startupTimeout": 30, "handler": {"compile": {"dynamic": "none"}}}
    archive = build(tiny_bert, "embedding", "big", tmp_path, config)
    assert archived_config(archive)["startupTimeout"] == 30  # the user's value is kept
    warning = capsys.readouterr().err
    assert "grid is too large for startupTimeout=30" in warning and "estimated" in warning


def test_the_precompile_progress_bar_walks_the_grid():
    from ts_compiled_handlers.scripts.precompile import ProgressBar

    stream = io.StringIO()  # not a terminal: one line per step
    bar = ProgressBar(width=10, stream=stream)
    for done in range(5):
        bar(done, 4)
    lines = stream.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "precompiling [..........] 0/4 shapes",
        "precompiling [##........] 1/4 shapes",
        "precompiling [#####.....] 2/4 shapes",
        "precompiling [#######...] 3/4 shapes",
        "precompiling [##########] 4/4 shapes",
    ]


def test_only_what_serving_reads_goes_into_the_archive(tiny_bert, tmp_path, capsys):
    """A Hub snapshot's ONNX, OpenVINO, TF, pickle and README leftovers stay out; the output lists both."""
    import shutil

    snapshot = tmp_path / "snapshot"
    shutil.copytree(tiny_bert, snapshot)
    leftovers = ["onnx/model.onnx", "openvino/openvino_model.bin", "tf_model.h5", "pytorch_model.bin", "README.md"]
    for name in leftovers + ["2_Normalize/.keep"]:
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(b"x")
    modules = json.loads((snapshot / "modules.json").read_text())
    (snapshot / "modules.json").write_text(json.dumps(modules + [{"path": "2_Normalize", "type": "x.Normalize"}]))
    archive = build(snapshot, "embedding", "tiny", tmp_path / "store", {"handler": {"dtype": "float32"}})
    with zipfile.ZipFile(archive) as mar:
        model_files = {name for name in mar.namelist() if not name.startswith(("ts_compiled_handlers/", "MAR-INF/"))}
    assert model_files == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        "model-config.yaml",
        "handler.py",
        "answer_ranges.json",  # int8/uint8 answers' ranges, written at build (tests/unit/test_quantized_answers.py)
    }  # no sitecustomize.py: nothing in an archive re-execs its worker
    printed = capsys.readouterr().out
    assert f"{archive} (" in printed and "model.safetensors" in printed and "ts_compiled_handlers/ (" in printed
    assert all(name in printed for name in leftovers)


def test_the_archive_carries_exactly_the_package_serving_files(tiny_bert, tmp_path):
    from ts_compiled_handlers.runtime import package_files

    archive = build(tiny_bert, "embedding", "tiny", tmp_path, {"handler": {"dtype": "float32"}})
    with zipfile.ZipFile(archive) as mar:
        ours = {name for name in mar.namelist() if name.startswith("ts_compiled_handlers/")}
    expected = {f"ts_compiled_handlers/{path.as_posix()}" for path in package_files.serving_files()}
    assert ours == expected and "ts_compiled_handlers/protocols/openai.py" in ours
    assert not any("/scripts/" in name or "/benchmarks/" in name or name.endswith(".pyc") for name in ours)


def test_an_archive_that_ships_a_compile_cache_compiles_unfrozen_graphs():
    from ts_compiled_handlers.scripts.build_mar import BuildError, model_config, unfrozen_for_cache

    config = model_config("embedding", {})
    assert unfrozen_for_cache(config, "cache")["handler"]["compile"]["freezing"] is False
    assert unfrozen_for_cache(config, None) == config == unfrozen_for_cache(config, "aot")
    asked = model_config("embedding", {"handler": {"compile": {"freezing": True}}})
    with pytest.raises(BuildError, match="inductor caches no frozen graph"):
        unfrozen_for_cache(asked, "cache")
    int8 = model_config("embedding", {"handler": {"quantize": "int8"}})  # its int8 kernels need freezing
    with pytest.raises(BuildError, match="--precompile cache with --quantize.*use --precompile aot"):
        unfrozen_for_cache(int8, "cache")
