"""Ahead-of-time compiled packages: built once with torch.export + AOTInductor, loaded by workers.

A worker that loads a package runs no dynamo, compiles nothing and builds no transformers model:
the archive carries the compiled model for a range of shapes (the bucket plan's bounds), and the
worker hands it the weights straight from the archive's safetensors, so the package holds code,
not a second copy of them. Its start is checked against eager answers the build recorded.

    <archive>/aot_package/model.pt2              the AOTInductor package (native code the worker runs)
    <archive>/aot_package/constants.safetensors  the few constants the checkpoint lacks (buffers)
    <archive>/aot_package/reference.safetensors  probe rows and eager's answers to them, from the build
    <archive>/aot_package/manifest.json          what it is valid for, where each weight is, sha256s

The package is loaded only from the archive's own folder and only after every checksum and every
field of its manifest match this worker; anything else is logged and the worker compiles instead.

An int8 model (`quantize`, handlers/quantizing/quantizing.py) is the exception: its int8 weights exist
only after quantizing, and its linears are int8 kernels only when inductor freezes them (oneDNN
prepacks the weights). Its package is built frozen, holds its weights in the native code (the
constants file is empty) and carries float32's answers to the calibration rows, which a worker's
gate holds the package against again.
"""

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Callable

import torch
import torch.utils._pytree as pytree
from torch.export._tree_utils import reorder_kwargs

from ts_compiled_handlers.compiling import compile_cache
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.engine.layout import Layout
from ts_compiled_handlers.engine.runner import NOT_SERVED, ModelRunner

logger = logging.getLogger(__name__)

PACKAGE_DIR = "aot_package"
PACKAGE_FILE = "model.pt2"
CONSTANTS_FILE = "constants.safetensors"
REFERENCE_FILE = "reference.safetensors"
FORMAT = "aot-4"  # 4: packed rows are pooled inside the package (handlers/engine/packing.py)
# Inductor settings of torch.compile's modes that have no meaning for an exported package.
NOT_FOR_AOT = ("triton.cudagraphs",)


class PackageError(ValueError):
    """A package that cannot be served: mismatched, corrupt, truncated, or not loadable."""


def manifest(hardware, dtype: torch.dtype, plan: buckets.BucketPlan, options, model_dir: Path, int8: dict) -> dict:
    """What the package depends on: the compile cache's fields (threads excluded, kernels read the
    count when they run) and the int8 settings (`quantize`, `smoothing`), under a format of its own."""
    return {**compile_cache.manifest(hardware, dtype, plan, options, model_dir), "format": FORMAT, **int8}


def bounds(plan: buckets.BucketPlan) -> tuple[tuple[int, int], tuple[int, int]]:
    """(batch min, max), (sequence min, max) the package serves: every shape the plan makes."""
    return (1, plan.max_batch), (plan.seq_lens[0], plan.max_seq_len)


def inductor_options(options, frozen: bool) -> dict:
    """The inductor settings of the configured compile mode, plus threads read at run time; frozen:
    the weights folded into the native code (an int8 model's), else read from the archive."""
    from torch._inductor import list_mode_options

    settings = {key: value for key, value in list_mode_options(options.mode).items() if key not in NOT_FOR_AOT}
    return {
        **settings,
        "cpp.dynamic_threads": True,  # a worker's share of the cores changes with the worker count
        "freezing": frozen,
        "aot_inductor.package_constants_in_so": frozen,
    }


def _example_inputs(
    plan: buckets.BucketPlan, device: torch.device, layout: Layout, min_batch: int = 1
) -> tuple[dict, dict]:
    """Inputs to trace with, and which of their dimensions are dynamic with what bounds.

    Example sizes differ from each other and from 1, which export would specialize on.
    """
    from torch.export import Dim

    (_, max_batch), (min_seq, max_seq) = bounds(plan)
    batch = min(2, max_batch)
    seq_len = min(max(min_seq, 10), max_seq)  # packed rows: several text slots (packing.text_slots)
    dims = {}
    if max_batch > min_batch:
        dims[0] = Dim("batch", min=min_batch, max=max_batch)
    if max_seq > min_seq:
        dims[1] = Dim("seq", min=min_seq, max=max_seq)
    input_ids = torch.full((batch, seq_len), 5, dtype=torch.long, device=device)
    if layout.pack_budget is None:
        attention_mask = torch.ones_like(input_ids)
        attention_mask[-1, seq_len - 1 :] = 0  # a padded row: the traced masking is the general one
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    else:  # two texts in the first row, a padded tail in the last
        positions = torch.arange(seq_len, device=device).expand(batch, seq_len) + layout.first_position
        segments = torch.ones_like(input_ids)
        segments[0, seq_len // 2 :] = 2
        segments[-1, seq_len - 1 :] = 0
        inputs = {"input_ids": input_ids, "position_ids": positions.contiguous(), "segments": segments}
    if layout.token_types:  # a text pair's second text in the first row
        token_type_ids = torch.zeros_like(input_ids)
        token_type_ids[0, seq_len // 2 :] = 1
        inputs["token_type_ids"] = token_type_ids
    return inputs, {name: dict(dims) for name in inputs}


@dataclasses.dataclass
class Reference:
    """Probe rows' token ids and eager's output rows for them, at the package's dtype; for an int8
    package also `calibration`: the gate's rows (a reranker's pairs, with `type_ids`) and float32's."""

    token_ids: list[list[int]]
    rows: list[torch.Tensor]
    calibration: "Reference | None" = None
    type_ids: list[list[int]] | None = None

    def tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        ids = {"ids": self.token_ids, "types": self.type_ids or []}
        tensors = {f"{prefix}{k}.{i}": torch.tensor(row, dtype=torch.long) for k in ids for i, row in enumerate(ids[k])}
        tensors |= {f"{prefix}rows.{i}": row.float().contiguous() for i, row in enumerate(self.rows)}
        return tensors | (self.calibration.tensors("calibration.") if self.calibration else {})

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        save_file(self.tensors(), str(path))

    @classmethod
    def load(cls, path: Path) -> "Reference":
        from safetensors.torch import load_file

        return cls.read(load_file(str(path)))

    @classmethod
    def read(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> "Reference":
        count = sum(name.startswith(f"{prefix}ids.") for name in tensors)
        ids = [tensors[f"{prefix}ids.{i}"].tolist() for i in range(count)]
        typed = f"{prefix}types.0" in tensors  # a reranker's calibration pairs
        types = [tensors[f"{prefix}types.{i}"].tolist() for i in range(count)] if typed else None
        rows = [tensors[f"{prefix}rows.{i}"] for i in range(count)]
        calibrated = not prefix and any(name.startswith("calibration.") for name in tensors)
        return cls(ids, rows, cls.read(tensors, "calibration.") if calibrated else None, types)


@dataclasses.dataclass
class Package:
    """A loaded package: its runner, the tensors it reads (kept alive here), eager's answers."""

    runner: "NativePackage"
    constants: dict[str, torch.Tensor]
    reference: Reference
    layout: Layout
    min_batch: int = 1
    frozen: bool = False  # its weights are in its native code (an int8 model's): it reads none


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers by every name they have (a tied weight has two, both of
    which export may read): the constants a package built from it needs."""
    return dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))


def as_loaded(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A checkpoint tensor as the handler's model holds it: loaded in float32, then cast to `dtype`."""
    return tensor.to(torch.float32).to(dtype) if tensor.is_floating_point() else tensor


def checkpoint_keys(model_dir: Path) -> dict[str, str]:
    """Every tensor name in the archive's safetensors files, with the file that holds it."""
    from safetensors import safe_open

    found = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as checkpoint:
            found.update({key: path.name for key in checkpoint.keys() if key not in found})
    return found


def same_path(name: str, key: str) -> bool:
    """A module name and a checkpoint key for the same tensor: one ends with the other (a wrapper
    or a base-model prefix, such as `encoder.` or `bert.`, is all that differs)."""
    return name == key or name.endswith("." + key) or key.endswith("." + name)


def weight_sources(
    module: torch.nn.Module, names: list[str], model_dir: Path, dtype: torch.dtype
) -> tuple[dict[str, list[str]], dict[str, torch.Tensor]]:
    """Where each constant the package reads is in the archive's safetensors ([file, key]), proven
    equal to the module's tensor once loaded as `load_weights` loads it; and the constants found in
    none (to ship with the package)."""
    from safetensors import safe_open

    keys = checkpoint_keys(model_dir)
    tensors = weights(module)
    sources, unfound, found = {}, [], {}
    for name in names:
        if id(tensors[name]) in found:  # another name of a tied weight (an LM head, a SPLADE projection)
            sources[name] = found[id(tensors[name])]
            continue
        wanted = tensors[name].detach().cpu()
        for key in sorted((key for key in keys if same_path(name, key)), key=len, reverse=True):
            with safe_open(str(model_dir / keys[key]), framework="pt") as checkpoint:
                loaded = as_loaded(checkpoint.get_tensor(key), dtype)
            if loaded.dtype == wanted.dtype and loaded.shape == wanted.shape and torch.equal(loaded, wanted):
                sources[name] = found[id(tensors[name])] = [keys[key], key]
                break
        else:
            unfound.append(name)
    missing = {}
    for name in unfound:  # a tied weight's name the checkpoint lacks reads the key its other name found
        if id(tensors[name]) in found:
            sources[name] = found[id(tensors[name])]
        else:
            missing[name] = tensors[name].detach().cpu().clone().contiguous()
    return sources, missing


def load_weights(model_dir: Path, sources: dict, packed: Path, dtype: torch.dtype, device: torch.device) -> dict:
    """The package's constants by name: from the archive's safetensors (cast as the model casts
    them) and from the package's own constants file; a tensor two names share is read once."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    loaded, by_file = {}, {}  # by_file: [(name, key)] by file
    for name, (file, key) in sources.items():
        by_file.setdefault(Path(file).name, []).append((name, key))  # never a path outside the archive
    for file, pairs in by_file.items():
        with safe_open(str(model_dir / file), framework="pt", device=str(device)) as checkpoint:
            read = {key: as_loaded(checkpoint.get_tensor(key), dtype) for key in {key for _, key in pairs}}
        loaded.update({name: read[key] for name, key in pairs})
    extra = load_file(str(packed / CONSTANTS_FILE), device=str(device))
    return loaded | extra


class NativePackage:
    """The package's native code, called with the model's keyword inputs. torch's own wrapper
    (`torch._inductor.package.load_package`) imports the compiler, dynamo included, a second of a
    worker's start for a package that compiles nothing, and parses the call spec at every call;
    this one needs only torch's C++ loader."""

    def __init__(self, package: Path, device: torch.device):
        index = (device.index or 0) if device.type == "cuda" else -1
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, index)
        self.in_spec, self.out_spec = (pytree.treespec_loads(spec) for spec in self.loader.get_call_spec())

    def __call__(self, **inputs: torch.Tensor) -> torch.Tensor:
        flat = pytree.tree_leaves(((), reorder_kwargs(inputs, self.in_spec)))
        return pytree.tree_unflatten(self.loader.boxed_run(flat), self.out_spec)

    def bind(self, tensors: dict[str, torch.Tensor]) -> None:
        """Read every constant from `tensors` (no copy: they must outlive the runner)."""
        wanted = {name: tensors[name] for name in self.loader.get_constant_fqns()}
        self.loader.load_constants(wanted, False, True, True, False)  # not folded; full update; user-managed


def _files(target: Path) -> dict:
    return {
        path.name: {"sha256": compile_cache.file_digest(path), "bytes": path.stat().st_size}
        for path in (target / PACKAGE_FILE, target / CONSTANTS_FILE, target / REFERENCE_FILE)
    }


def package_constants(program, module: torch.nn.Module, model_dir: Path, dtype: torch.dtype) -> tuple[dict, dict]:
    """Where each constant the exported program reads comes from: the archive's safetensors
    (`weight_sources`), or the package's own constants file, which also takes the tensors the
    model's code makes as it runs (DeBERTa's relative positions) and export lifts into constants."""
    names = sorted(set(program.state_dict) | set(program.constants))
    own = weights(module)
    lifted = {name: program.constants[name].detach().cpu().contiguous() for name in names if name not in own}
    sources, missing = weight_sources(module, [name for name in names if name in own], model_dir, dtype)
    return sources, missing | lifted


def export_over_batches(module: torch.nn.Module, inputs_for: Callable[[int], tuple[dict, dict]], max_batch: int):
    """The exported program and the least batch it serves: 1, or 2 where the model's trace
    specializes a batch of one (CUDA's attention does, on torch 2.11); a lone row is then run
    beside a copy of itself (`AotModel`, `SidePackage`). `inputs_for(min_batch)` gives the example
    inputs and their dynamic dimensions."""
    from torch._dynamo.exc import UserError

    for min_batch in (1, 2):
        inputs, dynamic_shapes = inputs_for(min_batch)
        try:
            with torch.inference_mode():
                return torch.export.export(module, (), inputs, dynamic_shapes=dynamic_shapes, strict=False), min_batch
        except UserError as cause:
            if min_batch > 1 or max_batch < 2 or "size()[0] != 1" not in str(cause):
                raise
            why = " ".join(str(cause).split("\n")[:2])
            logger.warning("The export specializes a batch of one: the package serves batches from 2 (%s)", why)
    raise AssertionError("unreachable")


def build(
    module: torch.nn.Module,
    plan: buckets.BucketPlan,
    options,
    valid_for: dict,
    model_dir: Path,
    reference: Reference,
    layout: Layout,
    frozen: bool = False,
) -> dict:
    """Export `module` over the plan's bounds, compile it with AOTInductor into the archive's
    `aot_package/` (frozen: with its weights, see above), and write where its weights are, the
    reference answers and the manifest; returns the build's timings."""
    device = next(module.parameters()).device
    began = time.perf_counter()
    program = export_over_batches(
        module, lambda min_batch: _example_inputs(plan, device, layout, min_batch), plan.max_batch
    )
    exported = time.perf_counter() - began
    described = {"layout": dataclasses.asdict(layout), "frozen": frozen}
    built = write(program, module, options, valid_for, model_dir / PACKAGE_DIR, reference.save, described)
    return {"export_seconds": round(exported, 1), **built}


def write(exported, module, options, valid_for: dict, target: Path, save_reference, described: dict) -> dict:
    """Compile an exported program (`export_over_batches`' answer) with AOTInductor into `target`,
    a folder of the archive, with where its weights are in the archive, the build's reference
    answers (`save_reference(path)`) and the manifest (plus `described`); returns the build's timings."""
    from safetensors.torch import save_file

    if options.backend != "inductor":
        raise PackageError(f"compile.backend is {options.backend!r}; ahead-of-time packages need 'inductor'")
    program, min_batch = exported
    model_dir = target.parent if target.name == PACKAGE_DIR else target.parent.parent  # aot_package/<side model>/
    target.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    frozen = described.get("frozen", False)
    with torch.no_grad():  # inductor freezes only where no gradient is recorded
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(target / PACKAGE_FILE), inductor_configs=inductor_options(options, frozen)
        )
    dtype = getattr(torch, valid_for["dtype"])
    sources, missing = ({}, {}) if frozen else package_constants(program, module, model_dir, dtype)
    save_file(missing, str(target / CONSTANTS_FILE))
    save_reference(target / REFERENCE_FILE)
    built = {
        "compile_seconds": round(time.perf_counter() - began, 1),
        "constants_from_checkpoint": len(sources),
        "constants_in_package": sorted(missing),
    }
    description = {"min_batch": min_batch, "valid_for": valid_for, "files": _files(target), "weights": sources}
    (target / compile_cache.MANIFEST_FILE).write_text(
        json.dumps({**description, **described, "built": built}, indent=2)
    )
    return built


def load(packed: Path, valid_for: dict, model_dir: Path, device: torch.device) -> Package:
    """The package's runner with its weights bound, and the build's reference answers; PackageError
    saying why not."""
    runner, constants, description = load_native(packed, valid_for, model_dir, device)
    try:
        layout = Layout(**description["layout"])
        reference = Reference.load(packed / REFERENCE_FILE)
    except Exception as cause:  # a manifest or a reference file of another format
        raise PackageError(f"the package does not load ({type(cause).__name__}: {cause})") from cause
    min_batch, frozen = description.get("min_batch", 1), description.get("frozen", False)
    return Package(runner, constants, reference, layout, min_batch, frozen)


def load_native(packed: Path, valid_for: dict, model_dir: Path, device: torch.device):
    """The native runner of the package in `packed` with its weights bound, those weights (which
    must outlive it) and its manifest, once every field and checksum matches; PackageError saying why not."""
    description = compile_cache.checked_manifest(packed, valid_for, PackageError)
    try:
        files, sources = description["files"], description["weights"]
    except (KeyError, TypeError) as cause:
        raise PackageError(f"unreadable manifest ({type(cause).__name__}: {cause})") from cause
    for name in (PACKAGE_FILE, CONSTANTS_FILE, REFERENCE_FILE):
        compile_cache.check_digest(packed / name, (files.get(name) or {}).get("sha256"), PackageError)
    try:
        dtype = getattr(torch, valid_for["dtype"])
        constants = load_weights(model_dir, sources, packed, dtype, device)
        runner = NativePackage(packed / PACKAGE_FILE, device)
        if not description.get("frozen", False):
            runner.bind(constants)
    except Exception as cause:  # safetensors, the runtime and torch raise many kinds: all mean "does not load"
        raise PackageError(f"the package does not load ({type(cause).__name__}: {cause})") from cause
    return runner, constants, description


class AotModel(ModelRunner):
    """A loaded package behind the model interface. Shapes outside the package's bounds (the AOT
    runtime does not check them) are answered by the eager model, loaded on first need and counted
    after ready; the package then reads the eager model's weights, so there is one copy (a frozen
    package keeps its own: the eager model of an int8 package is the unquantized one)."""

    outside = "a shape outside the AOT package's bounds reached it"
    int8_gate = None  # an int8 package's gate, once a worker has checked the package against it

    def __init__(self, package: Package, load_eager: Callable[[], torch.nn.Module], plan: buckets.BucketPlan):
        super().__init__(None)
        self.runner = package.runner
        self.constants = package.constants
        self.load_eager = load_eager
        self.bounds = bounds(plan)
        self.min_batch = package.min_batch
        self.frozen = package.frozen

    @property
    def eager_loaded(self) -> bool:
        return self._eager is not None

    @property
    def eager(self) -> torch.nn.Module:
        if self._eager is None:
            self._eager = self.load_eager()
            if self.runner is not None and not self.frozen:
                self.runner.bind(weights(self._eager))
                self.constants = None
        return self._eager

    @property
    def is_compiled(self) -> bool:
        return self.runner is not None

    def fall_back_to_eager(self, fallback) -> None:
        logger.error("Serving the model EAGERLY (AOT package dropped): %s", fallback)
        self.runner = None
        self.fallback = fallback

    def fits(self, inputs: dict) -> bool:
        shape = inputs["input_ids"].shape
        (min_batch, max_batch), (min_seq, max_seq) = self.bounds
        return len(shape) == 2 and min_batch <= shape[0] <= max_batch and min_seq <= shape[1] <= max_seq

    def _fast(self, inputs: dict) -> torch.Tensor | object:
        if not self.fits(inputs):
            return NOT_SERVED
        return run_at_least(self.runner, inputs, self.min_batch)


def run_at_least(runner: Callable, inputs: dict, min_batch: int):
    """The runner's answer to `inputs`; a batch smaller than the least the export serves
    (`export_over_batches`) runs beside copies of its first row, which are cut from the answer."""
    rows = next(iter(inputs.values())).shape[0]
    if rows >= min_batch:
        return runner(**inputs)
    padded = {name: value.repeat_interleave(min_batch, dim=0)[:min_batch] for name, value in inputs.items()}
    return pytree.tree_map(lambda answer: answer[:rows], runner(**padded))
