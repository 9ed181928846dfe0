"""The compile cache's manifest, packing and host sharing, with stand-in cache contents.

The real handler's use of it (packed cache hit, metrics, several TorchServe workers) is tested in
tests/integration/test_compile_cache_server.py.
"""

import errno
import fcntl
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ts_compiled_handlers.compiling import compile_cache
from ts_compiled_handlers.compiling.compile_cache import HostCache, PackedCacheError
from ts_compiled_handlers.runtime import metrics, package_files, private_dirs, process_settings
from ts_compiled_handlers.startup import build_steps, warmup
from ts_compiled_handlers.worker import ready_report

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


# A shared machine: the cache's folders and lock file are this user's own, and its I/O errors never
# fail a worker (TorchServe would restart it into a compile that fails again, forever).


@pytest.fixture(autouse=True)
def throwaway_folders_in_tmp_path(tmp_path, monkeypatch):
    """A worker without the host cache gives inductor a throwaway temp folder: the test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.mark.parametrize("planted", ["other owner", "world-writable"])
def test_a_cache_folder_another_user_owns_or_may_write_is_refused_never_used(tmp_path, caplog, planted):
    root = tmp_path / "root"
    root.mkdir()
    if planted == "other owner":
        os.chown(root, 12345, 12345)
    else:
        root.chmod(0o777)
    cache = HostCache(root, VALID_FOR)
    with caplog.at_level(logging.WARNING), cache.lease(None) as lease:
        assert (lease.source, lease.directory, lease.holding_lock) == ("error", None, False)
        throwaway = Path(os.environ[process_settings.INDUCTOR_CACHE_ENV])  # not inductor's predictable default
        assert throwaway.name.startswith("hfserve-inductor-") and throwaway.stat().st_mode & 0o777 == 0o700
    assert list(root.iterdir()) == []  # no lock file, no copy: nothing read or written there
    assert cache.failure == "not_private"
    reason = "owned by uid 12345" if planted == "other owner" else "writable by other users (mode 0777)"
    assert f"{root} is {reason}" in caplog.text and "remove it" in caplog.text


def test_the_default_folder_is_this_users_own_and_the_variable_names_another(monkeypatch):
    monkeypatch.delenv(compile_cache.ROOT_ENV, raising=False)
    monkeypatch.setenv("COMPILED_HANDLERS_CACHE_DIR", "/srv/old")  # the name it had before 0.1: not read
    assert compile_cache.default_root() == private_dirs.TEMP / "compile-cache"
    assert private_dirs.TEMP.name == f"hfserve-{os.getuid()}"
    monkeypatch.setenv(compile_cache.ROOT_ENV, "/srv/cache")
    assert compile_cache.default_root() == Path("/srv/cache")
    monkeypatch.setenv(compile_cache.ROOT_ENV, "off")
    assert compile_cache.default_root() is None


@pytest.mark.parametrize("target_exists", [False, True])
def test_a_symlinked_lock_file_is_not_followed(tmp_path, caplog, target_exists):
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    target = tmp_path / "victim"
    if target_exists:
        target.write_text("someone's data")
    (root / f"{compile_cache.manifest_key(VALID_FOR)}.lock").symlink_to(target)
    with caplog.at_level(logging.WARNING), HostCache(root, VALID_FOR).lease(None) as lease:
        assert lease.source == "error"
    assert (target.read_text() == "someone's data") if target_exists else not target.exists()
    assert "Compile cache OFF for this worker" in caplog.text and "Too many levels of symbolic links" in caplog.text


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_when_publishing_leaves_the_worker_serving_said_once(tmp_path, caplog, monkeypatch):
    root = tmp_path / "root"
    cache = HostCache(root, VALID_FOR)
    with caplog.at_level(logging.WARNING), cache.lease(None) as lease:
        fake_inductor_cache(lease.directory)
        monkeypatch.setattr(compile_cache.shutil, "copytree", disk_full)
        cache.publish(lease)  # no exception: the worker goes on serving what it compiled
        cache.publish(lease)
        assert not lease.holding_lock and (lease.directory / "kernel.so").is_file()
    assert cache.failure == "ENOSPC" and not cache.published.exists() and not list(root.glob("*.tmp-*"))
    assert caplog.text.count("Compile cache NOT PUBLISHED") == 1 and "No space left" in caplog.text
    with open(root / f"{cache.key}.lock") as lock:  # let go: the next worker compiles, not waits
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_cache_that_cannot_be_written_at_all_is_given_up_before_compiling(tmp_path, caplog, monkeypatch, code):
    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(compile_cache, "open_lock", refused)
    cache = HostCache(tmp_path / "root", VALID_FOR)
    with caplog.at_level(logging.WARNING), cache.lease(packed_cache(tmp_path)) as lease:
        assert lease.source == "error" and not lease.holding_lock  # no lock held: siblings are not kept waiting
    assert cache.failure == errno.errorcode[code]
    assert "Compile cache OFF for this worker" in caplog.text and os.strerror(code) in caplog.text


def test_the_failure_label_names_the_errno_even_inside_a_copy_error():
    assert compile_cache.failure_label(OSError(errno.EROFS, "Read-only file system")) == "EROFS"
    copy_error = shutil.Error([("a", "b", "[Errno 28] No space left on device: 'b'")])
    assert compile_cache.failure_label(copy_error) == "ENOSPC"
    assert compile_cache.failure_label(OSError("no errno")) == "other"
    assert compile_cache.failure_label(private_dirs.NotPrivateError("x")) == "not_private"


def test_a_worker_whose_cache_fails_starts_serving_and_counts_it(tmp_path, caplog, monkeypatch):
    """compile_and_warm_up with stand-ins for the model and its warm-up: a full disk while
    publishing, then the ready report's metric."""
    monkeypatch.setenv(compile_cache.ROOT_ENV, str(tmp_path / "host"))
    monkeypatch.setattr(compile_cache, "manifest", lambda *args: VALID_FOR)
    monkeypatch.setattr(process_settings, "stop_compile_workers", lambda: None)
    engine = SimpleNamespace(
        model=SimpleNamespace(is_compiled=False, fallback=None, int8_gate=None),
        dtype=torch.float32,
        plan=SimpleNamespace(dynamic="all", seq_lens=(8,), batch_sizes=(1,)),
    )
    compile_options = SimpleNamespace(enable=True, cache_dir="auto", mode="default", regional=False)
    config = SimpleNamespace(compile=compile_options, quantize="none", smoothing=0.6)
    serving = SimpleNamespace(config=config, model_dir=tmp_path, compile_options=None)

    def compiled(engine, serving, progress=None, eager=None):
        fake_inductor_cache(Path(os.environ[process_settings.INDUCTOR_CACHE_ENV]))
        engine.model.is_compiled = True
        monkeypatch.setattr(compile_cache.shutil, "copytree", disk_full)
        return warmup.WarmupReport(shapes=1, graphs=1, compile_seconds=1.0, warmup_seconds=1.0)

    monkeypatch.setattr(build_steps, "warm_up", compiled)
    counted = []

    class Counted(metrics.MetricsSink):
        def count(self, name, label, value):
            counted.append((name, label, value))

    with caplog.at_level(logging.INFO):
        started = build_steps.compile_and_warm_up(engine, serving, load_seconds=1.0)
        assert started.cache_source == "compiled" and started.host_cache.failure == "ENOSPC"
        ready_report.announce(Counted(), engine, started, serving, SimpleNamespace(threads=1, workers=1), seconds=2.0)
    assert counted == [("CompileCacheErrors", "ENOSPC", 1)]
    assert caplog.text.count("Compile cache NOT PUBLISHED") == 1 and "Ready in 2.0s from compiled" in caplog.text
