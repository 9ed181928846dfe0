"""Starting a worker from the archive's AOT package, and building that package (handlers/compiling/aot_package.py).

A worker serves the package only if it matches this worker (manifest), is whole (sha256) and
answers the build's recorded probe rows; otherwise it says why, loudly, and compiles instead. The
build (`hfserve build --precompile aot`, scripts/precompile.py) loads the model as a worker would,
decides its layout by the same check, and exports it.
"""

import json
import logging
import time
from pathlib import Path

import torch

from ts_compiled_handlers.compiling import aot_package, compile_cache
from ts_compiled_handlers.compiling.side_packages import SidePackages
from ts_compiled_handlers.engine import local_attention, native_ops, packing
from ts_compiled_handlers.engine.engine import Engine
from ts_compiled_handlers.engine.layout import Layout
from ts_compiled_handlers.engine.runner import EagerRunner
from ts_compiled_handlers.quantizing import quantizing
from ts_compiled_handlers.runtime import hardware
from ts_compiled_handlers.startup import warmup
from ts_compiled_handlers.startup.serving import Serving, Started
from ts_compiled_handlers.tasks import Task

logger = logging.getLogger(__name__)


def package_manifest(serving: Serving, dtype: torch.dtype) -> dict:
    """What an AOT package must have been built for to serve this worker."""
    options, variant = serving.compile_options, quantizing.variant(serving.config)
    return aot_package.manifest(hardware.detect(), dtype, serving.plan, options, serving.model_dir, variant)


def side_packages(serving: Serving, dtype: torch.dtype) -> SidePackages | None:
    """The archive's packages of the task's side models (None where compiling is off)."""
    return SidePackages(serving, lambda: package_manifest(serving, dtype)) if serving.config.compile.enable else None


def built_manifest(packed: Path) -> dict:
    """The package's manifest as the build wrote it, or {} (its own check then says why not)."""
    try:
        built = json.loads((packed / compile_cache.MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return built if isinstance(built, dict) else {}


def package_dtype(serving: Serving, built: dict) -> torch.dtype:
    """The dtype a worker serves the package at: the configured one; for `auto`, the build's choice,
    which is the hardware's pick, or float32 where the build's drift check refused that pick (the
    build checked on this model, on hardware with the CPU flags or CUDA capability the manifest
    makes this worker match, so it is not checked again). Without this a model whose bfloat16
    drifts was never served from its package: the worker asked for one at bfloat16 and compiled."""

    def refused_at_build(picked: torch.dtype) -> bool:
        try:
            return built["valid_for"]["dtype"] == "float32"
        except (KeyError, TypeError):
            return False  # the manifest's own check says why this package cannot serve

    return hardware.serving_dtype(serving.config.dtype, refused_at_build)


def serve_package(task: Task, serving: Serving, began: float, progress=None) -> tuple[Engine, Started] | None:
    """The engine over the archive's AOT package, warmed and checked; None (and why, in the log)
    where there is none or it cannot serve this worker."""
    packed = serving.model_dir / aot_package.PACKAGE_DIR
    if not (packed.is_dir() and serving.config.compile.enable and task.AOT):
        return None
    built = built_manifest(packed)
    dtype = package_dtype(serving, built)
    per_text = isinstance(built.get("layout"), dict) and built["layout"].get("per_text") is True
    if per_text or local_attention.configured(serving.model_config):
        native_ops.load()  # the operators its native code calls, built or loaded before the package
    try:
        package = aot_package.load(packed, package_manifest(serving, dtype), serving.model_dir, serving.device)
        load_eager = _eager_loader(task, serving, dtype, package.layout)
        engine = task.engine(aot_package.AotModel(package, load_eager, serving.plan), serving, dtype, package.layout)
        load_seconds = time.perf_counter() - began
        report = warm_up_package(engine, serving, package.reference, progress)
        check_int8_gate(engine, task, serving, package.reference.calibration)
    except (aot_package.PackageError, warmup.WarmupError, quantizing.QuantizationRefused) as error:
        # mismatched, damaged, or other answers (than the build's, or than float32's past the int8 gate)
        logger.warning("AOT package IGNORED, compiling instead: %s: %s", type(error).__name__, error)
        return None
    except Exception as error:  # a defect: the traceback, then compile all the same
        logger.warning("AOT package IGNORED, compiling instead: %s: %s", type(error).__name__, error, exc_info=True)
        return None
    return engine, Started(report, "aot", load_seconds)


def _eager_loader(task: Task, serving: Serving, dtype: torch.dtype, layout: Layout):
    """Loads the eager model, for an AOT worker that needs it after all (a shape outside the package)."""

    def load() -> torch.nn.Module:
        began = time.perf_counter()
        module = task.load_model(serving.model_dir).eval().to(serving.device, dtype)
        logger.info("Eager model loaded in %.1fs", time.perf_counter() - began)
        return packing.PackedModel(module) if layout.packed else module

    return load


def check_int8_gate(engine: Engine, task: Task, serving: Serving, calibration: aot_package.Reference | None) -> None:
    """An int8 package held against float32's answers to the calibration rows, as the build's gate
    held the int8 model (QuantizationRefused below its floor); its figures go to the ready line."""
    if calibration is None:
        return
    floors = quantizing.floors(serving.config)
    gate = quantizing.Int8Gate(
        calibration.token_ids, calibration.rows, task.LABELS, floors, type_ids=calibration.type_ids
    )
    gate.check(engine)
    gate.release()
    engine.model.int8_gate = gate


def warm_up_package(engine: Engine, serving: Serving, reference: aot_package.Reference, progress=None):
    """Each length bucket once at batch 1 and the largest batch once, then the package against the
    build's eager answers. A package's first call at a new shape costs what later calls do (only
    the first calls of all set up the runtime; docs/design.md, "Cold start and AOT packages"), so
    the whole grid bought nothing; the build ran it, and the full check, on its own host."""
    began = time.perf_counter()
    plan = engine.plan
    shapes = [(1, seq_len) for seq_len in plan.seq_lens] + [(plan.max_batch, plan.seq_lens[0])]
    for done, (batch, seq_len) in enumerate(shapes, start=1):
        engine.run(serving.probes.filler(seq_len, batch), one_per_row=True)
        if progress is not None:
            progress(done, len(shapes))
    seconds = time.perf_counter() - began
    if serving.config.warmup.verify:
        outputs = engine.run(reference.token_ids).rows
        allowed = allowance(serving, engine.dtype, int8=reference.calibration is not None)
        warmup.check_drift("AOT package vs the build's eager", outputs, reference.rows, allowed)
    return warmup.WarmupReport(len(shapes), 0, seconds, seconds)


def build_package(task: Task, serving: Serving, eager: Engine) -> dict:
    """Export the eager engine's model into the archive's AOT package, with eager's answers on the
    probe rows that a worker checks the package against (returns the build's timings)."""
    if serving.device.type == "cuda":
        logger.warning(
            "AOT packages built on a GPU segfaulted when loaded in the only GPU run so far (torch 2.11, "
            "docs/gpu.md): if workers crash at start, build without --precompile aot"
        )
    probe = serving.probes.package_rows()
    gate = eager.model.int8_gate  # an int8 model: its package is frozen and carries the gate's rows
    calibration = aot_package.Reference(gate.rows, gate.reference, type_ids=gate.type_ids) if gate is not None else None
    reference = aot_package.Reference(probe, eager.run(probe).rows, calibration)
    valid_for = package_manifest(serving, eager.dtype)
    module, options, frozen = eager.model.eager, serving.compile_options, gate is not None
    if isinstance(module, quantizing.AroundInt8):
        module = module.with_named_inputs()
    built = aot_package.build(
        module, serving.plan, options, valid_for, serving.model_dir, reference, eager.layout, frozen
    )
    side = task.build_side_packages(serving, eager.dtype, SidePackages(serving, lambda: valid_for))
    return {**built, "side_packages": side} if side else built


def check_package_everywhere(engine: Engine, serving: Serving, progress=None, eager_module=None) -> None:
    """The whole grid through the served package, then its answers against the eager model (the
    package's own, or `eager_module`: the build's int8 model) at every length: what the build checks
    beyond a worker's start."""
    warmup.run_grid(engine, 1, serving.probes.filler, None, progress)
    probe = serving.probes.check_rows()
    eager = engine.on(EagerRunner(eager_module or engine.model.eager)).run(probe).rows
    served = engine.run(probe).rows
    allowed = allowance(serving, engine.dtype, int8=eager_module is not None)
    warmup.check_drift("AOT package vs eager, every length", served, eager, allowed)


def allowance(serving: Serving, dtype: torch.dtype, int8: bool) -> float:
    """How far a package may drift from the build's eager answers: the dtype's tolerance; for an
    int8 package, the int8 gate's. Its frozen oneDNN kernels round otherwise than the eager model's
    quantize/dequantize pairs (MiniLM, most linears int8: 6.5e-3), and the gate against float32, run
    next, is what judges int8, as it does for a compiled int8 model (build_steps.warm_up)."""
    return quantizing.tolerance(serving.config) if int8 else serving.tolerance(dtype)
