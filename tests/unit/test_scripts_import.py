"""Every script imports: a renamed function or constant breaks the command line, not only its tests."""

import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


@pytest.mark.parametrize("path", [path for path in SCRIPTS if path.stem != "__init__"], ids=lambda path: path.name)
def test_the_script_imports(path):
    module = importlib.import_module(f"scripts.{path.stem}")
    if 'if __name__ == "__main__":' in path.read_text():  # a command, not a library of the others
        assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
