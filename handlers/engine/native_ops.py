"""The attention operators' native library: `hfserve::text_attention` (per-text attention over packed
rows, text_attention.py) and `hfserve::local_attention` (sliding-window layers at their window's
cost, local_attention.py), built once per host with the C++ compiler inductor uses and loaded.

Inductor calls both as extern kernels, in compiled graphs and in AOT packages. Where the library
cannot be built (no compiler: a slim image), `load` says why once and each attention keeps SDPA.
"""

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

from ts_compiled_handlers.runtime import hardware, private_dirs

logger = logging.getLogger(__name__)

OPS_DIR_ENV = "HFSERVE_OPS_DIR"
SOURCES = tuple(
    Path(__file__).with_name(name) for name in ("text_attention.cpp", "text_attention_bf16.cpp", "local_attention.cpp")
)
HEADER = Path(__file__).with_name("text_attention.h")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++20", "-fPIC")
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"}


def vector_flags(cpu_flags: set[str]) -> list[str]:
    """The width of ATen's vectors the kernel is built for, as inductor picks it: AVX512, AVX2 or scalar."""
    if AVX512 <= cpu_flags:
        return ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
    if {"avx2", "fma"} <= cpu_flags:
        return ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return ["-DCPU_CAPABILITY=DEFAULT"]


def library_path() -> Path:
    """Where this source, this torch and this CPU's build is kept (built once per host)."""
    key = hashlib.sha256()
    for path in (*SOURCES, HEADER):
        key.update(path.read_bytes())
    key.update(f"{torch.__version__} {sys.version} {' '.join(FLAGS)}".encode())
    key.update(" ".join(sorted(_cpu_flags())).encode())
    return ops_folder() / f"attention-ops-{key.hexdigest()[:16]}.so"


def ops_folder() -> Path:
    """$HFSERVE_OPS_DIR (one build shared by every server of a host, or baked into an image), else
    this user's folder in the temp dir (a server started by `hfserve start` has its own)."""
    chosen = os.environ.get(OPS_DIR_ENV)
    return Path(chosen) if chosen else private_dirs.TEMP / "ops"


def _cpu_flags() -> set[str]:
    """Every flag: `-march=native` builds for all of them, so a library is never loaded on a CPU
    that lacks one (a shared $HFSERVE_OPS_DIR)."""
    return set(hardware.read_cpu_flags(wanted=None))


def build(target: Path) -> None:
    """Compile the operators into `target`: their units at once (2 cores: about 10 s, not 20),
    then linked atomically, so a half-written library is never loaded."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    includes = [f"-I{path}" for path in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libraries = [f"-L{path}" for path in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu", "-ltorch"]
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        objects = [Path(scratch) / f"{source.stem}.o" for source in SOURCES]
        flags = [*FLAGS, *vector_flags(_cpu_flags()), *includes]
        units = [
            subprocess.Popen([compiler, *flags, "-c", str(source), "-o", str(out)], stderr=subprocess.PIPE, text=True)
            for source, out in zip(SOURCES, objects, strict=True)
        ]
        errors = [unit.communicate()[1] for unit in units]  # each read to its end: no pipe fills
        _check(compiler, [(unit.returncode, text) for unit, text in zip(units, errors, strict=True)])
        partial = Path(scratch) / target.name
        linked = subprocess.run(
            [compiler, *FLAGS, "-shared", *map(str, objects), "-o", str(partial), *libraries],
            capture_output=True,
            text=True,
        )
        _check(compiler, [(linked.returncode, linked.stderr)])
        partial.replace(target)


def _check(compiler: str, results: list[tuple[int, str]]) -> None:
    for code, errors in results:
        if code != 0:
            raise RuntimeError(f"{compiler} failed ({code}): {errors.strip()[-2000:]}")


@contextlib.contextmanager
def _held(lock: Path):
    """An exclusive lock on `lock` (this user's private folder; never through a symbolic link)."""
    descriptor = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


@functools.cache
def load() -> bool:
    """Build (once per host) and load the operator; False, logged with the reason, where it cannot be."""
    if hasattr(torch.ops.hfserve, "text_attention"):
        return True
    try:
        target = library_path()
        private_dirs.private_folder(target.parent)  # a library found there is loaded: only ours
        if not target.exists():
            with _held(target.with_suffix(".lock")):  # workers starting together: one builds, the rest wait
                if not target.exists():
                    logger.info("Building the attention operators (once per host): %s", target)
                    build(target)
        torch.ops.load_library(str(target))
        torch.library.register_fake("hfserve::text_attention")(_per_text_like)
        torch.library.register_fake("hfserve::local_attention")(_banded_like)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        logger.warning(
            "Attention operators unavailable: packed rows keep SDPA with the block mask, sliding-window "
            "layers SDPA with their banded mask: %s",
            error,
        )
        return False
    return True


def _per_text_like(query, key, value, segments, scale, causal, dense_from):
    rows, heads, tokens, dim = query.shape
    return query.new_empty(rows, tokens, heads, dim)


def _banded_like(query, key, value, mask, window, scale):
    rows, heads, tokens, dim = query.shape
    return query.new_empty(rows, tokens, heads, dim)
