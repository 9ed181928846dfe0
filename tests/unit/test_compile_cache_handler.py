"""A real handler (tiny BERT, in process) with a packed compile cache: used, refused, or ignored."""

import errno
import json
import logging
import shutil

import pytest
from fakes import answered, ready_handler
from torch._dynamo.utils import counters

from ts_compiled_handlers.compiling import compile_cache
from ts_compiled_handlers.servers.torchserve.handler import Handler

# Unfrozen graphs: inductor caches no graph whose weights it froze (what `--precompile cache` builds)
GRID = {"buckets": {"seq_lens": [8, 16], "batch_sizes": [1, 2]}, "compile": {"freezing": False}}


@pytest.fixture(scope="module")
def packed_model(tiny_bert, tmp_path_factory):
    """A copy of tiny BERT whose compile_cache/ holds what a handler compiled against an empty host cache."""
    model = tmp_path_factory.mktemp("packed") / "model"
    shutil.copytree(tiny_bert, model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(compile_cache.ROOT_ENV, str(tmp_path_factory.mktemp("build-host")))
        builder = ready_handler("embedding", model, **GRID)
    assert builder.started.cache_source == "compiled"
    cache = builder.started.host_cache
    compile_cache.pack(cache.published, cache.valid_for, model / compile_cache.PACKED_DIR, {"initialize_seconds": 1})
    return model


@pytest.fixture
def empty_host(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.ROOT_ENV, str(tmp_path / "host"))


def test_a_matching_packed_cache_is_loaded_not_compiled(packed_model, empty_host, caplog, monkeypatch):
    steps = []
    monkeypatch.setattr(Handler, "warmup_progress", staticmethod(lambda done, total: steps.append(done)))
    with caplog.at_level(logging.INFO):
        handler = ready_handler("embedding", packed_model, **GRID)
    assert steps == [0, 1, 2, 3, 4]  # the build's progress bar is told about every shape of the 2 x 2 grid
    assert handler.started.cache_source == "archive"
    assert "compile cache: hit, unpacked from the archive" in caplog.text
    assert counters["inductor"]["fxgraph_cache_hit"] == handler.started.report.graphs > 0
    assert counters["inductor"]["fxgraph_cache_miss"] == 0


def test_a_packed_cache_for_other_settings_is_refused_naming_the_field(packed_model, empty_host, caplog):
    with caplog.at_level(logging.INFO):
        handler = ready_handler("embedding", packed_model, **{**GRID, "dtype": "bfloat16"})
    assert handler.started.cache_source == "compiled"
    assert "Packed compile cache IGNORED" in caplog.text
    assert "dtype: packed 'float32', this worker 'bfloat16'" in caplog.text
    assert "compile cache: miss, compiled here" in caplog.text


def test_a_worker_with_another_thread_count_still_loads_the_packed_cache(packed_model, empty_host, caplog):
    """A scale-up gives each worker fewer threads: its kernels read the count at run time, so it still hits."""
    packed = json.loads((packed_model / compile_cache.PACKED_DIR / compile_cache.MANIFEST_FILE).read_text())
    assert "threads" not in packed["valid_for"] and packed["valid_for"]["dynamic_threads"] is True
    with caplog.at_level(logging.INFO):
        handler = ready_handler("embedding", packed_model, threads=1, **GRID)
    assert handler.threads.threads == 1 and handler.started.cache_source == "archive"
    assert counters["inductor"]["fxgraph_cache_miss"] == 0


def test_a_truncated_packed_cache_never_breaks_the_worker(packed_model, empty_host, tmp_path, caplog):
    model = tmp_path / "model"
    shutil.copytree(packed_model, model)
    tarball = model / compile_cache.PACKED_DIR / compile_cache.TARBALL_FILE
    tarball.write_bytes(tarball.read_bytes()[:1000])
    with caplog.at_level(logging.INFO):
        handler = ready_handler("embedding", model, **GRID)
    assert "Packed compile cache IGNORED" in caplog.text and "corrupt" in caplog.text
    assert handler.started.cache_source == "compiled" and handler.engine.model.is_compiled
    assert len(answered(handler, [{"inputs": "still serving"}])[0]["embedding"]) == 32


def test_the_cache_can_be_switched_off_per_model_or_per_host(tiny_bert, empty_host, monkeypatch):
    handler = ready_handler("embedding", tiny_bert, **{**GRID, "compile": {"cache_dir": "off"}})
    assert handler.started.cache_source == "off" and handler.engine.model.is_compiled
    monkeypatch.setenv(compile_cache.ROOT_ENV, "off")
    handler = ready_handler("embedding", tiny_bert, **GRID)
    assert handler.started.cache_source == "off" and handler.engine.model.is_compiled


def test_a_full_disk_under_the_host_cache_never_fails_the_worker(tiny_bert, empty_host, caplog, monkeypatch):
    """Publishing what it compiled fails: the worker serves anyway (else TorchServe restarts it to
    compile and fail again), says why once and counts it."""

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(compile_cache.shutil, "copytree", disk_full)
    with caplog.at_level(logging.INFO):
        handler = ready_handler("embedding", tiny_bert, **GRID)
    assert handler.started.cache_source == "compiled" and handler.engine.model.is_compiled
    assert handler.started.host_cache.failure == "ENOSPC"
    assert caplog.text.count("Compile cache NOT PUBLISHED") == 1 and "No space left" in caplog.text
    assert len(answered(handler, [{"inputs": "still serving"}])[0]["embedding"]) == 32
