"""Attention over each packed text alone: the `hfserve::text_attention` operator and its loading.

Over packed rows, SDPA scores every token against every token of its row and the block-diagonal
mask discards the pairs that straddle two texts (73% of the scores on the load test's traffic,
docs/performance.md). The operator (text_attention.cpp, built here with the C++ compiler inductor
uses) scores each text against itself only. Inductor calls it as an extern kernel, in the compiled
graph and in AOT packages; `reference` is what it is tested against.

It is reached through transformers' attention interface: `enable(model)` switches a model's
attention to `ATTENTION`, which runs the operator when the call carries the rows' segments
(`text_segments`, PackedModel) and SDPA otherwise (padded calls, sliding windows). Where the
operator cannot be built, `enable` says why once in the log and the model keeps SDPA with the mask.
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
SOURCES = tuple(Path(__file__).with_name(name) for name in ("text_attention.cpp", "text_attention_bf16.cpp"))
HEADER = Path(__file__).with_name("text_attention.h")
ATTENTION = "hfserve_text"  # the name under transformers' attention interface
SEGMENTS_KWARG = "text_segments"  # the (rows, T) segment ids a packed call passes down to attention
DENSE_FROM = 384  # texts longer than this go to SDPA on their own slice (its kernels' rate pays there)
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
    return ops_folder() / f"text_attention-{key.hexdigest()[:16]}.so"


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
    """Compile the operator into `target`: its two units at once (2 cores: about 10 s, not 20),
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
                    logger.info("Building the per-text attention operator (once per host): %s", target)
                    build(target)
        torch.ops.load_library(str(target))
        torch.library.register_fake("hfserve::text_attention")(_output_like)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        logger.warning("Per-text attention unavailable, packed rows keep SDPA with the block mask: %s", error)
        return False
    return True


def _output_like(query, key, value, segments, scale, causal, dense_from):
    rows, heads, tokens, dim = query.shape
    return query.new_empty(rows, tokens, heads, dim)


def reference(query, key, value, segments, scale: float, causal: bool) -> torch.Tensor:
    """What the operator computes, text by text in float32: (rows, T, heads, D), zeros at padding."""
    rows, heads, tokens, dim = query.shape
    out = query.new_zeros(rows, tokens, heads, dim)
    group = heads // key.shape[1]
    for row in range(rows):
        ids = segments[row].tolist()
        start = 0
        while start < tokens:
            end = start + 1
            while end < tokens and ids[end] == ids[start]:
                end += 1
            if ids[start] > 0:
                q = query[row, :, start:end].float()
                k = key[row, :, start:end].float().repeat_interleave(group, dim=0)
                v = value[row, :, start:end].float().repeat_interleave(group, dim=0)
                scores = q @ k.transpose(-1, -2) * scale
                if causal:
                    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
                out[row, start:end] = (scores.softmax(-1) @ v).transpose(0, 1).to(out.dtype)
            start = end
    return out


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-interface call: per text where the call carries its segments."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments = kwargs.get(SEGMENTS_KWARG)
    if segments is None or kwargs.get("sliding_window") or query.device.type != "cpu":
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    causal = bool(getattr(module, "is_causal", False))
    out = torch.ops.hfserve.text_attention(query, key, value, segments, scale, causal, DENSE_FROM)
    return out, None


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def enable(model: torch.nn.Module) -> bool:
    """Switch `model`'s attention (each transformers model inside it) to per text over packed rows;
    False, its attention left as it was, where the operator cannot be built or the model does not
    attend through SDPA and transformers' attention interface."""
    models = _transformers_models(model)
    # SDPA models only: SDPA is what the padded calls fall back to, and what `disable` restores
    if not models or any(part.config._attn_implementation != "sdpa" for part in models) or not load():
        return False
    _register()
    try:
        for part in models:
            part.set_attn_implementation(ATTENTION)
    except (ValueError, ImportError) as error:
        logger.warning("Per-text attention off, packed rows keep SDPA with the block mask: %s", error)
        disable(model)
        return False
    return True


def disable(model: torch.nn.Module) -> None:
    """Back to SDPA with the block mask."""
    for part in _transformers_models(model):
        part.set_attn_implementation("sdpa")


def is_enabled(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == ATTENTION


def _transformers_models(model: torch.nn.Module) -> list:
    """The outermost transformers models in `model` (one switch covers their submodules)."""
    from transformers import PreTrainedModel

    found, inner = [], set()
    for part in model.modules():
        if isinstance(part, PreTrainedModel) and id(part) not in inner:
            found.append(part)
            inner.update(id(sub) for sub in part.modules())
    return found
