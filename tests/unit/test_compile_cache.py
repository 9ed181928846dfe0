"""The compile cache's manifest, packing and host sharing, with stand-in cache contents.

The real handler's use of it (packed cache hit, metrics, several TorchServe workers) is tested in
tests/integration/test_compile_cache_server.py.
"""

import logging
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest

from ts_compiled_handlers.runtime import package_files, process_settings
from ts_compiled_handlers.startup import compile_cache
from ts_compiled_handlers.startup.compile_cache import HostCache, PackedCacheError

VALID_FOR = {"format": 1, "torch": "2.13.0", "dtype": "bfloat16", "buckets": {"seq_lens": [16]}}


def fake_inductor_cache(directory: Path, marker: str = "kernel") -> Path:
    (directory / "fxgraph" / "ab").mkdir(parents=True)
    (directory / "fxgraph" / "ab" / "entry").write_text(marker)
    (directory / "kernel.so").write_bytes(b"\x7fELF" + marker.encode() * 1000)
    return directory


def packed_cache(tmp_path: Path, valid_for: dict = VALID_FOR) -> Path:
    source = fake_inductor_cache(tmp_path / "compiled")
    return compile_cache.pack(source, valid_for, tmp_path / "archive" / "compile_cache", {"initialize_seconds": 1})


@pytest.fixture(autouse=True)
def keep_inductor_cache_dir():
    """HostCache.lease points this process's inductor elsewhere; give the test session its cache back."""
    previous = os.environ.get(process_settings.INDUCTOR_CACHE_ENV)
    yield
    if previous:
        process_settings.use_inductor_cache(Path(previous))
    else:
        os.environ.pop(process_settings.INDUCTOR_CACHE_ENV, None)


def test_a_matching_packed_cache_is_unpacked_then_shared_by_the_host(tmp_path):
    packed = packed_cache(tmp_path)
    first = HostCache(tmp_path / "root", VALID_FOR)
    with first.lease(packed) as lease:
        assert lease.source == "archive"
        assert (lease.directory / "fxgraph" / "ab" / "entry").read_text() == "kernel"
        assert os.environ[process_settings.INDUCTOR_CACHE_ENV] == str(lease.directory)
    with HostCache(tmp_path / "root", VALID_FOR).lease(None) as second:
        assert second.source == "host"
        assert (second.directory / "kernel.so").read_bytes() == (tmp_path / "compiled" / "kernel.so").read_bytes()
    assert second.directory != first.published  # workers read and write a copy; the published one stays as is


def test_a_manifest_that_differs_is_refused_naming_the_field(tmp_path, caplog):
    packed = packed_cache(tmp_path)
    wanted = {**VALID_FOR, "buckets": {"seq_lens": [32]}}
    with pytest.raises(PackedCacheError, match="buckets: packed"):
        compile_cache.read_packed(packed, wanted)
    with caplog.at_level(logging.WARNING), HostCache(tmp_path / "root", wanted).lease(packed) as lease:
        assert lease.source == "compiled"
    assert "Packed compile cache IGNORED" in caplog.text and "buckets: packed" in caplog.text


def test_the_code_digest_covers_subpackages_and_file_paths(tmp_path):
    """A cache or package built by other handler code must not load, wherever in the package the change is."""
    package = tmp_path / "handlers"
    shutil.copytree(package_files.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    original = compile_cache.handlers_digest(package)
    assert original == compile_cache.handlers_digest()
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "stale.py").write_text("x = 1\n")
    assert compile_cache.handlers_digest(package) == original  # not code a worker runs
    (package / "extra").mkdir()
    (package / "extra" / "one.py").write_text("x = 1\n")
    in_subpackage = compile_cache.handlers_digest(package)
    assert in_subpackage != original
    (package / "extra" / "one.py").rename(package / "extra" / "two.py")
    assert compile_cache.handlers_digest(package) not in (original, in_subpackage)  # same bytes, another path


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_a_corrupt_or_truncated_packed_cache_is_ignored(tmp_path, caplog, damage):
    packed = packed_cache(tmp_path)
    tarball = packed / compile_cache.TARBALL_FILE
    data = tarball.read_bytes()
    if damage == "truncate":
        tarball.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        tarball.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "delete":
        tarball.unlink()
    else:
        (packed / compile_cache.MANIFEST_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING), HostCache(tmp_path / "root", VALID_FOR).lease(packed) as lease:
        assert lease.source == "compiled"
        assert list(lease.directory.iterdir()) == []  # nothing of the damaged cache is used
    assert "Packed compile cache IGNORED" in caplog.text
    assert not (tmp_path / "root" / compile_cache.manifest_key(VALID_FOR)).exists()


def test_what_a_worker_compiled_is_published_only_when_it_says_so(tmp_path):
    root = tmp_path / "root"
    with pytest.raises(RuntimeError), HostCache(root, VALID_FOR).lease(None) as lease:
        fake_inductor_cache(lease.directory)
        raise RuntimeError("compile failed")
    with HostCache(root, VALID_FOR).lease(None) as lease:  # the failed worker left nothing published
        assert lease.source == "compiled"
    cache = HostCache(root, VALID_FOR)
    with cache.lease(None) as lease:
        fake_inductor_cache(lease.directory)
        cache.publish(lease)
    assert (cache.published / "fxgraph" / "ab" / "entry").read_text() == "kernel"
    assert not list(root.glob("*.tmp-*"))
    published_files = [path for path in cache.published.rglob("*") if path.is_file()]
    assert published_files and all(path.stat().st_mode & 0o222 == 0 for path in published_files)  # read-only
    with HostCache(root, VALID_FOR).lease(None) as reader:
        assert reader.source == "host" and os.access(reader.directory / "kernel.so", os.W_OK)


def test_a_host_cache_that_cannot_be_copied_is_compiled_around(tmp_path, caplog, monkeypatch):
    root = tmp_path / "root"
    cache = HostCache(root, VALID_FOR)
    with cache.lease(None) as lease:
        fake_inductor_cache(lease.directory)
        cache.publish(lease)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compile_cache.shutil, "copytree", disk_full)
    with caplog.at_level(logging.WARNING), HostCache(root, VALID_FOR).lease(None) as lease:
        assert lease.source == "compiled" and not lease.holding_lock  # others are not kept waiting
        assert list(lease.directory.iterdir()) == []
    assert "Compile cache of this host UNREADABLE" in caplog.text and "No space left" in caplog.text


@pytest.mark.heavy  # starts a process
def test_copies_of_dead_workers_are_removed(tmp_path):
    root = tmp_path / "root"
    cache = HostCache(root, VALID_FOR)
    dead = multiprocessing.get_context("fork").Process(target=time.sleep, args=(0,))
    dead.start()
    dead.join()
    leftover = root / cache.own.name.replace(str(os.getpid()), str(dead.pid))
    leftover.mkdir(parents=True)
    half_written = root / f"{cache.key}.tmp-abc"
    half_written.mkdir()
    with cache.lease(None):
        assert not leftover.exists() and not half_written.exists()


def _start_worker(root: str, results, delay: float) -> None:
    """One 'worker': compile slowly (a file written in pieces) when it must, else load; report what it saw."""
    cache = HostCache(Path(root), VALID_FOR)
    with cache.lease(None) as lease:
        if lease.source == "compiled":
            with open(lease.directory / "kernel.so", "wb") as kernel:
                for _ in range(10):
                    kernel.write(b"x" * 1000)
                    kernel.flush()
                    time.sleep(delay / 10)
            cache.publish(lease)
        size = (lease.directory / "kernel.so").stat().st_size
    results.put((lease.source, size))


@pytest.mark.heavy  # starts a process
@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_four_workers_started_at_once_compile_once(tmp_path, attempt):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [context.Process(target=_start_worker, args=(str(tmp_path), results, 0.5)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    seen = sorted(results.get(timeout=5) for _ in workers)
    assert seen == [("compiled", 10_000)] + [("host", 10_000)] * 3  # nobody saw a half-written kernel
