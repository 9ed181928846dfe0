"""A model folder's sentence-transformers files, read as its library reads them: the settings files
every task may find beside the weights (modules.json, config_sentence_transformers.json...)."""

import json
from pathlib import Path
from typing import Any


def read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


def named_prompts(settings: dict) -> dict[str, str]:
    """A config_sentence_transformers.json's prompts by name (a null one is no prompt)."""
    return {name: text for name, text in (settings.get("prompts") or {}).items() if text is not None}


def module_folder(model_dir: Path, kind: str) -> Path | None:
    """The folder of the model's sentence-transformers module of `kind` (`Pooling`, `Normalize`, ...)."""
    modules = read_json(model_dir / "modules.json", [])
    found = next((module for module in modules if module["type"].endswith("." + kind)), None)
    return None if found is None else model_dir / found.get("path", "")
