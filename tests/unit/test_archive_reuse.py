"""`hfserve serve` reuses model_store/NAME.mar only when it is whole and built from the same model
content, and archives are written atomically (the archiver itself is a stand-in here; the real
build runs in test_build_mar.py and the command in tests/integration/test_serve_command.py)."""

import os
import subprocess

import pytest

from ts_compiled_handlers.scripts import build_mar, serve_model


def model(folder, text="weights"):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_text(text)
    return folder


@pytest.fixture
def builds(monkeypatch):
    """The models built, in order; a build of a model named `interrupted` writes half an archive
    in place and is stopped (Ctrl-C), as the archiver did."""
    built = []

    def build(model_dir, task, name, store, config):
        built.append(model_dir.name)
        target = store / f"{name}.mar"
        if model_dir.name == "interrupted":
            target.write_bytes(b"PK half")
            raise KeyboardInterrupt
        target.write_bytes(b"archive of " + (model_dir / "model.safetensors").read_bytes())
        return target

    monkeypatch.setattr(build_mar, "build", build)
    return built


def serve(model_dir, store):
    return serve_model.archive(model_dir, "embedding", "name", {"handler": {}}, store)


def test_an_archive_cut_short_is_never_reused_for_another_model(tmp_path, builds):
    store = tmp_path / "store"
    store.mkdir()
    first = model(tmp_path / "first")
    serve(first, store)
    with pytest.raises(KeyboardInterrupt):
        serve(model(tmp_path / "interrupted"), store)
    assert serve(first, store).read_bytes() == b"archive of weights"
    assert builds == ["first", "interrupted", "first"]


def keeping_size_and_mtime(path, content: bytes) -> None:
    """Rewrite a file in place as a copy that keeps times would (`cp -p`, rsync -t)."""
    before = path.stat()
    assert len(content) == before.st_size
    path.write_bytes(content)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_model_or_archive_changed_with_the_same_size_and_mtime_is_rebuilt(tmp_path, builds):
    store = tmp_path / "store"
    store.mkdir()
    source = model(tmp_path / "m")
    serve(source, store)
    serve(source, store)
    assert builds == ["m"]  # unchanged: reused
    keeping_size_and_mtime(source / "model.safetensors", b"WEIGHTS")
    assert serve(source, store).read_bytes() == b"archive of WEIGHTS"
    assert builds == ["m", "m"]
    keeping_size_and_mtime(store / "name.mar", b"archive of ZZZZZZZ")  # say, another build's --force
    assert serve(source, store).read_bytes() == b"archive of WEIGHTS"
    assert builds == ["m", "m", "m"]


def archiver(content: bytes, interrupted: bool):
    """torch-model-archiver's stand-in: writes NAME.mar in place into its --export-path."""

    def run(command, check, env):
        export = command[command.index("--export-path") + 1]
        name = command[command.index("--model-name") + 1]
        with open(os.path.join(export, f"{name}.mar"), "wb") as archive:
            archive.write(content)
        if interrupted:
            raise KeyboardInterrupt
        return subprocess.CompletedProcess(command, 0)

    return run


def test_an_archive_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    (store / "name.mar").write_bytes(b"the previous build")
    staging = tmp_path / "staging"
    monkeypatch.setattr(build_mar.subprocess, "run", archiver(b"PK half", interrupted=True))
    with pytest.raises(KeyboardInterrupt):
        build_mar.archive(staging, "name", staging / "handler.py", store)
    assert [path.name for path in store.iterdir()] == ["name.mar"]  # no partial file left beside it
    assert (store / "name.mar").read_bytes() == b"the previous build"
    monkeypatch.setattr(build_mar.subprocess, "run", archiver(b"PK whole", interrupted=False))
    assert build_mar.archive(staging, "name", staging / "handler.py", store).read_bytes() == b"PK whole"
    assert [path.name for path in store.iterdir()] == ["name.mar"]
