"""Every script and benchmark imports as a module of the installed package (a renamed function or
constant breaks the command line, not only its tests), nothing outside tests/ leans on the tests'
helpers, and nothing but the precompiler puts a folder on sys.path."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = sorted(path for folder in ("scripts", "benchmarks") for path in (ROOT / folder).glob("*.py"))
TEST_HELPERS = sorted(path.stem for path in (ROOT / "tests").glob("*.py"))


@pytest.mark.parametrize("path", [path for path in COMMANDS if path.stem != "__init__"], ids=lambda path: path.name)
def test_the_script_imports(path):
    module = importlib.import_module(f"ts_compiled_handlers.{path.parent.name}.{path.stem}")
    if 'if __name__ == "__main__":' in path.read_text():  # a command, not a library of the others
        assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


def test_nothing_outside_tests_imports_from_tests():
    helpers = "|".join(["tests", *TEST_HELPERS])
    importing = re.compile(rf"^\s*(from|import) ({helpers})\b|sys\.path.*[\"']tests[\"']", re.MULTILINE)
    folders = ("handlers", "scripts", "benchmarks", "deploy")  # the project's code; not venvs under runs/
    sources = [ROOT / "setup.py", *(path for folder in folders for path in (ROOT / folder).rglob("*.py"))]
    assert len(sources) > 40
    offenders = [str(path.relative_to(ROOT)) for path in sources if importing.search(path.read_text())]
    assert offenders == []


def test_only_the_precompiler_puts_a_folder_on_sys_path():
    """The package is imported by its name; the precompiler alone makes an archive's root
    importable, as TorchServe does a worker's model folder, for a user's handler file there."""
    sources = [path for folder in ("handlers", "scripts", "benchmarks") for path in (ROOT / folder).rglob("*.py")]
    offenders = [str(path.relative_to(ROOT)) for path in sources if "sys.path.insert" in path.read_text()]
    assert offenders == ["scripts/precompile.py"]
