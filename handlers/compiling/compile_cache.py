"""The compile cache: what it is valid for, how it is packed into a .mar, and how workers share it.

Inductor's cache directory restores by copy to any path (measured: the same hits as in place),
so that is what is packed. On a host, one directory per manifest is shared by every worker:

    <root>/<key>/                   published: complete, its files read-only
    <root>/<key>.lock               held by the worker that fills <key>/ (others wait on it)
    <root>/<key>.worker-<host>-<pid>/   each worker's own copy, where inductor reads and writes

A worker takes the lock; if <key>/ exists it copies it and lets go at once. Otherwise it fills
<key>/ from the packed cache, or compiles with the lock held and publishes what it wrote by an
atomic rename, so the workers waiting on the lock load instead of compiling too.

Inductor unpickles what the cache holds, so <root> must be this user's own folder (by default
`<tmp>/hfserve-<uid>/compile-cache`, handlers/runtime/private_dirs.py) and the lock file is never
a symbolic link. The cache only saves time: where it cannot be used (a disk full or read-only, a
folder refused) the worker serves without it, says why once in the log and counts it in
`CompileCacheErrors`, rather than fail its start, be restarted and compile again forever.
"""

import atexit
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

import torch

from ts_compiled_handlers.runtime import package_files, private_dirs, process_settings
from ts_compiled_handlers.runtime.hardware import read_cpu_flags

logger = logging.getLogger(__name__)

ROOT_ENV = "HFSERVE_CACHE_DIR"
PACKED_DIR = "compile_cache"
MANIFEST_FILE = "manifest.json"
TARBALL_FILE = "inductor-cache.tar.gz"
FORMAT = 1
# Inductor builds its C++ kernels for the vector ISA these flags allow (read from /proc/cpuinfo:
# asking inductor itself compiles a probe program, seconds at every start).
CPU_VECTOR_FLAGS = (
    "avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip


def default_root() -> Path | None:
    """The host's cache root: $HFSERVE_CACHE_DIR (`off`: none), else this user's folder in the temp dir."""
    chosen = os.environ.get(ROOT_ENV)
    if chosen == "off":
        return None
    return Path(chosen) if chosen else private_dirs.TEMP / "compile-cache"


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def handlers_digest(package: Path = package_files.PACKAGE) -> str:
    """This package's serving source, subpackages included: how it marks shapes and builds graphs
    decides what gets compiled. Each file's path is hashed with its bytes, so a moved file changes it too."""
    digest = hashlib.sha256()
    for source in package_files.serving_files(package):
        digest.update(source.as_posix().encode() + b"\0" + (package / source).read_bytes())
    return digest.hexdigest()


def manifest(hardware, dtype: torch.dtype, plan, compile_options, model_dir: Path) -> dict:
    """Everything a compiled kernel depends on; a cache is used only where all of it matches. Not the
    thread count: kernels read it at run time (inductor's cpp.dynamic_threads, handlers/runtime/process_settings.py),
    so a worker started by a scale-up, with fewer threads, still loads the cache."""
    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "triton": triton_version(),
        "device": hardware.device,
        "cuda_capability": list(hardware.cuda_capability) if hardware.cuda_capability else None,
        "cpu_flags": sorted(read_cpu_flags(wanted=CPU_VECTOR_FLAGS)),
        "dtype": str(dtype).removeprefix("torch."),
        "dynamic_threads": True,
        "buckets": {
            "seq_lens": list(plan.seq_lens),
            "batch_sizes": list(plan.batch_sizes),
            "pack_tokens": plan.pack_tokens,
        },
        "compile": {
            name: getattr(compile_options, name)
            for name in ("backend", "mode", "freezing", "fullgraph", "dynamic", "regional")
        },
        "model_config": file_digest(Path(model_dir) / "config.json"),
        "handlers": handlers_digest(),
    }


def differences(wanted: dict, found: dict) -> list[str]:
    """The manifest fields that differ, each as `field: packed X, this worker Y`."""
    return [
        f"{name}: packed {found.get(name)!r}, this worker {wanted[name]!r}"
        for name in wanted
        if found.get(name) != wanted[name]
    ]


def manifest_key(valid_for: dict) -> str:
    return hashlib.sha256(json.dumps(valid_for, sort_keys=True).encode()).hexdigest()[:20]


class PackedCacheError(ValueError):
    """A packed cache that cannot be used: mismatched, corrupt or truncated."""


def pack(cache_dir: Path, valid_for: dict, target: Path, built: dict) -> Path:
    """Write `target/` (the archive's compile_cache folder): the tarball and its manifest."""
    target.mkdir(parents=True, exist_ok=True)
    tarball = target / TARBALL_FILE
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(cache_dir, arcname=".")
    description = {
        "valid_for": valid_for,
        "tarball": {"file": TARBALL_FILE, "sha256": file_digest(tarball), "bytes": tarball.stat().st_size},
        "built": built,
    }
    (target / MANIFEST_FILE).write_text(json.dumps(description, indent=2))
    return target


def checked_manifest(folder: Path, valid_for: dict, error: type[Exception]) -> dict:
    """The folder's manifest if it is readable and valid for this worker; else `error` saying why
    (the packed cache's and the AOT package's manifests alike)."""
    try:
        description = json.loads((folder / MANIFEST_FILE).read_text())
        found = description["valid_for"]
    except (OSError, ValueError, KeyError, TypeError) as cause:
        raise error(f"unreadable manifest ({type(cause).__name__}: {cause})") from cause
    mismatched = differences(valid_for, found)
    if mismatched:
        raise error("built for another setup; " + "; ".join(mismatched))
    return description


def check_digest(path: Path, expected: str | None, error: type[Exception]) -> None:
    """`error` unless `path` is a file whose sha256 is `expected`."""
    if not path.is_file() or file_digest(path) != expected:
        raise error(f"{path.name} is missing, truncated or corrupt (sha256 mismatch)")


def read_packed(packed: Path, valid_for: dict) -> Path:
    """The packed tarball if it is whole and valid for this worker; else PackedCacheError saying why."""
    description = checked_manifest(packed, valid_for, PackedCacheError)
    try:
        tarball = packed / Path(description["tarball"]["file"]).name
        expected = description["tarball"]["sha256"]
    except (KeyError, TypeError) as cause:
        raise PackedCacheError(f"unreadable manifest ({type(cause).__name__}: {cause})") from cause
    check_digest(tarball, expected, PackedCacheError)
    return tarball


def unpack(tarball: Path, target: Path) -> None:
    with tarfile.open(tarball, "r:gz") as archive:
        archive.extractall(target, filter="data")


@dataclasses.dataclass
class Lease:
    """This worker's cache directory, where it came from, and (while compiling) the held lock."""

    directory: Path | None  # None where the host cache was given up
    source: str  # "archive", "host", "compiled", or "error" (given up: inductor gets a throwaway folder)
    holding_lock: bool


class HostCache:
    """The cache directory this host keeps for one manifest, shared by its workers."""

    def __init__(self, root: Path, valid_for: dict):
        self.root = Path(root)
        self.valid_for = valid_for
        self.key = manifest_key(valid_for)
        self.published = self.root / self.key
        self.own = self.root / f"{self.key}.worker-{socket.gethostname()}-{os.getpid()}"
        self.failure: str | None = None  # why the cache failed (`failure_label`), for CompileCacheErrors
        self._lock: int | None = None

    @contextlib.contextmanager
    def lease(self, packed: Path | None) -> Iterator[Lease]:
        """Point inductor at this worker's copy of the host cache; `publish()` it after compiling.

        The lock is held through the body only when nothing could be loaded, so that one worker
        compiles while the others wait. A body that raises or never publishes leaves nothing behind.
        An OSError on the cache gives it up: the body runs with a throwaway folder of its own.
        """
        lease = self._take(packed)
        try:
            directory = lease.directory or _throwaway_folder()
            if directory is not None:
                process_settings.use_inductor_cache(directory)
            yield lease
        finally:
            self._close_lock()

    def publish(self, lease: Lease) -> None:
        """Make what this worker compiled the host's cache: copied aside, then renamed into place.
        If that fails (a full or read-only disk), this worker still serves what it compiled."""
        if not lease.holding_lock:
            return
        staging = self.root / f"{self.key}.tmp-{os.getpid()}"
        try:
            shutil.copytree(lease.directory, staging)
            _seal(staging)
            staging.rename(self.published)
            logger.info("Compile cache published for the other workers of this host: %s", self.published)
        except OSError as error:
            shutil.rmtree(staging, ignore_errors=True)
            self._failed(error, "NOT PUBLISHED (this worker serves what it compiled, the next one compiles again)")
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            lease.holding_lock = False

    def _take(self, packed: Path | None) -> Lease:
        """Take the lock and fill this worker's copy; the lock is kept only by a worker that compiles."""
        try:
            private_dirs.private_folder(self.root)
            self._lock = open_lock(self.root / f"{self.key}.lock")
            fcntl.flock(self._lock, fcntl.LOCK_EX)  # released on close, also when the process dies
            self._remove_dead_copies()
            source = self._fill(packed)
            shutil.rmtree(self.own, ignore_errors=True)
            if source == "compiled":
                self.own.mkdir()
                return Lease(self.own, source, holding_lock=True)
            source = self._copy_published(source)
        except OSError as error:
            self._close_lock()
            self._failed(error, "OFF for this worker, which serves without it")
            return Lease(None, "error", holding_lock=False)
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        return Lease(self.own, source, holding_lock=False)

    def _failed(self, error: OSError, outcome: str) -> None:
        """Said once in the log, with the reason and what to do; kept for the CompileCacheErrors metric."""
        if self.failure is not None:
            return
        self.failure = failure_label(error)
        advice = "" if isinstance(error, private_dirs.NotPrivateError) else f" ({ADVICE})"
        logger.warning("Compile cache %s: %s%s", outcome, error, advice)

    def _close_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _copy_published(self, source: str) -> str:
        """This worker's own copy of the published cache; an empty one (compile) if it cannot be made."""
        try:
            shutil.copytree(self.published, self.own, copy_function=_writable_copy)
            return source
        except OSError as error:
            self._failed(error, "of this host UNREADABLE, compiling instead")
            shutil.rmtree(self.own, ignore_errors=True)
            self.own.mkdir()
            return "compiled"

    def _fill(self, packed: Path | None) -> str:
        """Where this worker's cache comes from; unpacks the archive's cache when it is usable."""
        if self.published.is_dir():
            return "host"
        if packed is None or not (packed / MANIFEST_FILE).is_file():
            return "compiled"
        staging = Path(tempfile.mkdtemp(prefix=f"{self.key}.tmp-", dir=self.root))
        try:
            unpack(read_packed(packed, self.valid_for), staging)
        except (PackedCacheError, tarfile.TarError, OSError, EOFError) as error:
            shutil.rmtree(staging, ignore_errors=True)
            logger.warning("Packed compile cache IGNORED, compiling instead: %s", error)
            return "compiled"
        _seal(staging)
        staging.rename(self.published)
        return "archive"

    def _remove_dead_copies(self) -> None:
        """Worker copies and half-written folders left by processes of this host that have died."""
        prefix = f"{self.key}.worker-{socket.gethostname()}-"
        for leftover in self.root.glob(f"{self.key}.*"):
            pid = leftover.name.removeprefix(prefix)
            stale_copy = leftover.name.startswith(prefix) and pid.isdigit() and not _alive(int(pid))
            if stale_copy or ".tmp-" in leftover.name:  # a .tmp- folder is never renamed after its lock is gone
                shutil.rmtree(leftover, ignore_errors=True)


ADVICE = f"free space, or set {ROOT_ENV} to a writable folder of this user's, or to `off`"


def _throwaway_folder() -> Path | None:
    """An inductor cache folder for a worker without the host cache (None if none can be made):
    never inductor's default `<tmp>/torchinductor_<user>`, which another user may have made first."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="hfserve-inductor-"))
    except OSError:
        return None
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # its kernels serve until the worker exits
    return folder


def open_lock(path: Path) -> int:
    """The lock file's descriptor, never through a symbolic link: whoever planted one would have us
    create or truncate the file it points to (ELOOP instead)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)


def failure_label(error: OSError) -> str:
    """The CompileCacheErrors label: the errno's name (ENOSPC, EROFS, EACCES, ...), `not_private`
    for a folder refused (handlers/runtime/private_dirs.py), else `other`."""
    if isinstance(error, private_dirs.NotPrivateError):
        return "not_private"
    number = error.errno
    if number is None:  # shutil.copytree's Error lists each file's OSError as text
        found = re.search(r"\[Errno (\d+)\]", str(error))
        number = int(found.group(1)) if found else None
    return errno.errorcode.get(number, "other")


def _seal(directory: Path) -> None:
    """Make every file read-only before the folder is published: no worker writes there."""
    for path in directory.rglob("*"):
        if path.is_file():
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _writable_copy(source: str, target: str) -> None:
    """A worker's own copy: inductor may rewrite its files."""
    shutil.copy2(source, target)
    os.chmod(target, os.stat(target).st_mode | stat.S_IWUSR)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
