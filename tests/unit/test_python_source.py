"""Source parsed again when CPython 3.11's shared tree-building count collides with another
thread's parse (scripts/python_source.py), and only then."""

import ast

import pytest

from ts_compiled_handlers.scripts import python_source


def flaky_parse(failures: int, message: str):
    calls = []

    def parse(source, filename):
        calls.append(filename)
        if len(calls) <= failures:
            raise SystemError(message)
        return ast.parse(source, filename)

    return parse, calls


def test_a_collision_is_parsed_again(tmp_path, monkeypatch):
    path = tmp_path / "module.py"
    path.write_text("def f():\n    return 1\n")
    parse, calls = flaky_parse(2, "AST constructor recursion depth mismatch (before=18, after=73)")
    monkeypatch.setattr(python_source, "parse", parse)
    monkeypatch.setattr(python_source.time, "sleep", lambda seconds: None)
    tree = python_source.parsed(path)
    assert [node.name for node in tree.body] == ["f"] and len(calls) == 3


def test_other_errors_and_a_lasting_collision_are_raised(tmp_path, monkeypatch):
    path = tmp_path / "module.py"
    path.write_text("x = 1\n")
    monkeypatch.setattr(python_source.time, "sleep", lambda seconds: None)
    parse, calls = flaky_parse(1, "some other internal error")
    monkeypatch.setattr(python_source, "parse", parse)
    with pytest.raises(SystemError, match="other"):
        python_source.parsed(path)
    assert len(calls) == 1
    parse, calls = flaky_parse(python_source.ATTEMPTS, python_source.MISMATCH)
    monkeypatch.setattr(python_source, "parse", parse)
    with pytest.raises(SystemError, match="mismatch"):
        python_source.parsed(path)
    assert len(calls) == python_source.ATTEMPTS


def test_bad_source_is_a_syntax_error(tmp_path):
    (tmp_path / "bad.py").write_text("def (:\n")
    with pytest.raises(SyntaxError):
        python_source.parsed(tmp_path / "bad.py")
