"""Every script and benchmark imports (a renamed function or constant breaks the command line, not
only its tests), and nothing outside tests/ leans on the tests' helpers."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = sorted(path for folder in ("scripts", "benchmarks") for path in (ROOT / folder).glob("*.py"))
TEST_HELPERS = sorted(path.stem for path in (ROOT / "tests").glob("*.py"))


@pytest.mark.parametrize("path", [path for path in COMMANDS if path.stem != "__init__"], ids=lambda path: path.name)
def test_the_script_imports(path):
    module = importlib.import_module(f"{path.parent.name}.{path.stem}")
    if 'if __name__ == "__main__":' in path.read_text():  # a command, not a library of the others
        assert callable(getattr(module, "main", None)), f"{path.name} has no main()"


def test_nothing_outside_tests_imports_from_tests():
    helpers = "|".join(["tests", *TEST_HELPERS])
    importing = re.compile(rf"^\s*(from|import) ({helpers})\b|sys\.path.*[\"']tests[\"']", re.MULTILINE)
    sources = [path for path in ROOT.rglob("*.py") if not path.relative_to(ROOT).parts[0].startswith((".", "tests"))]
    assert len(sources) > 40
    offenders = [str(path.relative_to(ROOT)) for path in sources if importing.search(path.read_text())]
    assert offenders == []
