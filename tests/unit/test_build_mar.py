import importlib
import inspect
import json
import zipfile

import pytest
import yaml

from handlers.config import TASKS
from scripts.build_mar import HANDLER_FILES, BuildError, build, check_model_dir


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
    assert {"embedding.py", "handlers/base.py", "handlers/metrics.yaml", "model.safetensors"} <= names
    assert {"tokenizer.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json"} <= names
    assert config["handler"] == {"task": "embedding", "dtype": "float32"}
    assert manifest["model"]["handler"] == "embedding.py"


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_a_handler_file_with_exactly_one_class(task):
    """TorchServe refuses a handler module that defines more than one class."""
    module = importlib.import_module(f"handlers.{HANDLER_FILES[task].removesuffix('.py')}")
    classes = [obj for obj in vars(module).values() if inspect.isclass(obj) and obj.__module__ == module.__name__]
    assert len(classes) == 1, classes
