"""Ahead-of-time compiled packages: built once with torch.export + AOTInductor, loaded by workers.

A worker that loads a package runs no dynamo and compiles nothing: the archive carries the
compiled model for a range of shapes (the bucket plan's bounds), and loading it takes a fraction
of a second. The package holds code only, not weights: the loader is given the eager model's own
tensors (`load_constants(user_managed=True)`), so the archive and the worker keep one copy.

    <archive>/aot_package/model.pt2        the AOTInductor package (native code the worker runs)
    <archive>/aot_package/manifest.json    what it is valid for, and its sha256

The package is loaded only from the archive's own folder and only after its checksum and every
field of its manifest match this worker; anything else is logged and the worker compiles instead.
"""

import json
import logging
import time
from pathlib import Path

import torch

from handlers import buckets, compile_cache

logger = logging.getLogger(__name__)

PACKAGE_DIR = "aot_package"
PACKAGE_FILE = "model.pt2"
FORMAT = "aot-1"
# Tasks whose module is one forward pass over (input_ids, attention_mask). Generation keeps the
# packed compile cache: its decode step and KV cache are not exported.
TASKS = ("embedding", "text-classification", "token-classification")
# Inductor settings of torch.compile's modes that have no meaning for an exported package.
NOT_FOR_AOT = ("triton.cudagraphs",)


class PackageError(ValueError):
    """A package that cannot be served: mismatched, corrupt, truncated, or not loadable."""


def manifest(hardware, dtype: torch.dtype, plan: buckets.BucketPlan, options, model_dir: Path) -> dict:
    """What the package depends on: the compile cache's fields (threads excluded, kernels read the
    count when they run), under a format of its own."""
    return {**compile_cache.manifest(hardware, dtype, plan, options, model_dir), "format": FORMAT}


def bounds(plan: buckets.BucketPlan) -> tuple[tuple[int, int], tuple[int, int]]:
    """(batch min, max), (sequence min, max) the package serves: every shape the plan makes."""
    return (1, plan.max_batch), (plan.seq_lens[0], plan.max_seq_len)


def inductor_options(options) -> dict:
    """The inductor settings of the configured compile mode, plus threads read at run time."""
    from torch._inductor import list_mode_options

    settings = {key: value for key, value in list_mode_options(options.mode).items() if key not in NOT_FOR_AOT}
    return {
        **settings,
        "cpp.dynamic_threads": True,  # a worker's share of the cores changes with the worker count
        "aot_inductor.package_constants_in_so": False,  # weights come from the archive's safetensors
    }


def _example_inputs(plan: buckets.BucketPlan, device: torch.device) -> tuple[dict, dict]:
    """Inputs to trace with, and which of their dimensions are dynamic with what bounds.

    Example sizes differ from each other and from 1, which export would specialize on.
    """
    from torch.export import Dim

    (_, max_batch), (min_seq, max_seq) = bounds(plan)
    batch = min(2, max_batch)
    seq_len = min(max(min_seq, 3), max_seq)
    dims = {}
    if max_batch > 1:
        dims[0] = Dim("batch", min=1, max=max_batch)
    if max_seq > min_seq:
        dims[1] = Dim("seq", min=min_seq, max=max_seq)
    input_ids = torch.full((batch, seq_len), 5, dtype=torch.long, device=device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, seq_len - 1 :] = 0  # a padded row: the traced masking is the general one
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    return inputs, {name: dict(dims) for name in inputs}


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers by name: the constants a package built from it needs."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def build(module: torch.nn.Module, plan: buckets.BucketPlan, options, valid_for: dict, target: Path) -> dict:
    """Export `module` over the plan's bounds, compile it with AOTInductor into `target/`, and write
    the manifest; returns the build's timings."""
    if options.backend != "inductor":
        raise PackageError(f"compile.backend is {options.backend!r}; ahead-of-time packages need 'inductor'")
    device = next(module.parameters()).device
    inputs, dynamic_shapes = _example_inputs(plan, device)
    target.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with torch.inference_mode():
        program = torch.export.export(module, (), inputs, dynamic_shapes=dynamic_shapes, strict=False)
    exported = time.perf_counter()
    missing = sorted((set(program.state_dict) | set(program.constants)) - set(weights(module)))
    if missing:
        raise PackageError(f"the exported model holds constants that are not its weights: {missing[:5]}")
    package = target / PACKAGE_FILE
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(package), inductor_configs=inductor_options(options)
    )
    built = {
        "export_seconds": round(exported - began, 1),
        "compile_seconds": round(time.perf_counter() - exported, 1),
    }
    description = {
        "valid_for": valid_for,
        "package": {
            "file": PACKAGE_FILE,
            "sha256": compile_cache.file_digest(package),
            "bytes": package.stat().st_size,
        },
        "built": built,
    }
    (target / compile_cache.MANIFEST_FILE).write_text(json.dumps(description, indent=2))
    return built


def load(packed: Path, valid_for: dict, module: torch.nn.Module, device: torch.device):
    """The package's runner, its constants bound to `module`'s tensors; PackageError saying why not."""
    try:
        description = json.loads((packed / compile_cache.MANIFEST_FILE).read_text())
        package = packed / Path(description["package"]["file"]).name  # never a path outside the folder
        expected_digest = description["package"]["sha256"]
        found = description["valid_for"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PackageError(f"unreadable manifest ({type(error).__name__}: {error})") from None
    mismatched = compile_cache.differences(valid_for, found)
    if mismatched:
        raise PackageError("built for another setup; " + "; ".join(mismatched))
    if not package.is_file() or compile_cache.file_digest(package) != expected_digest:
        raise PackageError(f"{package.name} is missing, truncated or corrupt (sha256 mismatch)")
    from torch._inductor.package import load_package

    try:
        runner = load_package(str(package), device_index=device.index if device.type == "cuda" else -1)
        tensors = weights(module)
        runner.load_constants(
            {name: tensors[name] for name in runner.get_constant_fqns()}, check_full_update=True, user_managed=True
        )
    except (RuntimeError, KeyError, OSError) as error:
        raise PackageError(f"{package.name} does not load ({type(error).__name__}: {error})") from None
    return runner


class AotModel:
    """A loaded package behind the interface of `CompiledModel`: shapes outside the package's
    bounds (the AOT runtime does not check them) are answered eagerly and counted after ready."""

    guards_thread_count = False  # no dynamo: kernels read the thread count when they run

    def __init__(self, runner, eager: torch.nn.Module, plan: buckets.BucketPlan, options):
        self.runner = runner
        self.eager = eager
        self.options = options
        self.bounds = bounds(plan)
        self.ready = False
        self.recompiles_after_ready = 0

    @property
    def is_compiled(self) -> bool:
        return self.runner is not None

    def compile(self) -> None:
        """Nothing to compile: the package is."""

    def mark_ready(self) -> None:
        self.ready = True

    def fall_back_to_eager(self, reason: str) -> None:
        logger.error("Serving the model EAGERLY (AOT package dropped): %s", reason)
        self.runner = None

    def fits(self, inputs: dict) -> bool:
        shape = inputs["input_ids"].shape
        (min_batch, max_batch), (min_seq, max_seq) = self.bounds
        return len(shape) == 2 and min_batch <= shape[0] <= max_batch and min_seq <= shape[1] <= max_seq

    def __call__(self, inputs: dict) -> torch.Tensor:
        if self.runner is not None and self.fits(inputs):
            return self.runner(**inputs)
        if self.runner is not None and self.ready:
            self.recompiles_after_ready += 1
            if self.recompiles_after_ready == 1:
                logger.warning(
                    "A shape outside the AOT package's bounds %s after ready %s; answered eagerly and counted "
                    "in RecompilesAfterReady (logged once)",
                    self.bounds,
                    tuple(inputs["input_ids"].shape),
                )
        return self.eager(**inputs)
